"""Draw the docs' hero picture (docs/index.md, the crash tutorial) from notebook 01's own run:
the lease chart of its first cell group (a simulated worker crash and its jobs' redelivery).

    python tools/readme_figure.py                    # writes docs/img/crash-redelivery.png
    python tools/readme_figure.py --out other.png

The code is not copied here: the cells of notebooks/01-quickstart.ipynb tagged
``readme-figure`` (the imports, the worker function, the simulated run and the chart) are
executed as they are, and the last of them (an expression: the ``lease_gantt`` call) is the
figure. Change the notebook and this picture follows; ``tests/test_readme_figure.py`` fails
when the committed PNG no longer matches what the notebook draws. Deterministic: the run is
seeded and the PNG carries no timestamp.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from istos_nb.views.charts import resize  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "01-quickstart.ipynb"
OUT = ROOT / "docs" / "img" / "crash-redelivery.png"
TAG = "readme-figure"
WIDTH_IN, DPI = 9.0, 100


def tagged_cells(notebook: Path = NOTEBOOK) -> list[str]:
    """Sources of the code cells tagged ``readme-figure``, IPython magics (``%...``) removed."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"
             and TAG in c.get("metadata", {}).get("tags", [])]
    if not cells:
        raise SystemExit(f"{notebook}: no code cell tagged {TAG!r}")
    sources = ["".join(c["source"]) for c in cells]
    return ["\n".join(line for line in s.splitlines() if not line.lstrip().startswith("%"))
            for s in sources]


def run_cells(notebook: Path = NOTEBOOK) -> tuple[dict[str, Any], str]:
    """Execute every tagged cell but the last; (namespace, the last cell's expression)."""
    *setup, chart = tagged_cells(notebook)
    namespace: dict[str, Any] = {"__name__": "readme_figure"}
    with contextlib.redirect_stdout(io.StringIO()):  # the run prints its summary
        for source in setup:
            exec(compile(source, str(notebook), "exec"), namespace)  # noqa: S102
    return namespace, chart


def crash_run(notebook: Path = NOTEBOOK) -> Any:
    """Notebook 01's simulated run (its ``result``, a SimResult)."""
    return run_cells(notebook)[0]["result"]


def figure(notebook: Path = NOTEBOOK) -> Figure:
    namespace, chart = run_cells(notebook)
    fig = eval(compile(chart, str(notebook), "eval"), namespace)  # noqa: S307
    if not isinstance(fig, Figure):
        raise SystemExit(f"the last {TAG!r} cell must evaluate to a Figure, not {type(fig)}")
    return resize(fig, WIDTH_IN)


def png_bytes(notebook: Path = NOTEBOOK) -> bytes:
    buf = io.BytesIO()
    figure(notebook).savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"PNG to write (default {OUT})")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(png_bytes())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
