"""Write ``tensor_server/render/luts.json``: the perceptual LUTs a render spec may name (viridis,
magma), as 256 sRGB colours each, taken from matplotlib's colormaps (its ``ListedColormap``
tables, published CC0 by their authors, van der Walt and Smith).

Why a generated file and not an import: matplotlib is not a dependency of the server (it is
large, and only these 1.5 KB of numbers are wanted); the file is regenerated, never edited
(``tests/render/spec_test.py`` pins entries of it). Run where matplotlib is importable:

    python tools/luts.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

NAMES = ("viridis", "magma")
OUT = Path(__file__).resolve().parent.parent / "tensor_server" / "render" / "luts.json"


def main() -> None:
    import matplotlib
    from matplotlib import colormaps

    tables = {}
    for name in NAMES:
        rgb = np.floor(np.asarray(colormaps[name].colors, np.float64)[:, :3] * 255 + 0.5).astype(int)
        assert rgb.shape == (256, 3), (name, rgb.shape)
        tables[name] = "".join(f"{r:02x}{g:02x}{b:02x}" for r, g, b in rgb)
    doc = {"source": f"matplotlib {matplotlib.__version__} colormaps, by tools/luts.py", "luts": tables}
    OUT.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({', '.join(NAMES)})")


if __name__ == "__main__":
    main()
