"""What it takes to run servers past one machine: configuration for the software in front of
them (``nginx.py``: read-only replicas behind nginx). Imports nothing of the server: it writes
text the operator's load balancer reads; the cli door calls it."""
