def routes(provider, renderer=None):
    return []
