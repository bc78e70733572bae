"""Writing a benchmark script's results: one JSON file with the run's
configuration and machine, and a plot beside it (same name, .png)."""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Callable, Iterable


def write_results(out: str | os.PathLike, args, internal: Iterable[str], payload: dict,
                  plot: Callable[[list, Path], None]) -> None:
    """Writes `payload` (its "results" are plotted) with the command-line
    options of `args` except the `internal` ones (a worker's re-execution
    flags), the machine and its load, then the plot; prints both paths."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k not in set(internal)}
    out.write_text(json.dumps({"config": config, "machine": platform.platform(),
                               "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
                               **payload}, indent=1))
    plot(payload["results"], out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
