"""Where handler modules are imported from, and the check that a provider's handler imports.

``hookline dev`` and ``hookline providers apply`` import from the working directory, every
``--import-path DIR`` and every directory of HOOKLINE_IMPORT_PATH (os.pathsep-separated, like
PYTHONPATH); ``hookline worker`` from the last two. They go first on ``sys.path``, as PYTHONPATH's do.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hookline.core import settings

IMPORT_PATH_ENV = settings.IMPORT_PATH


def import_dirs(flags: list[Path] | None, *, working_directory: bool) -> list[Path]:
    """The directories to import handlers from, in order: the working directory (when asked),
    the --import-path flags, then HOOKLINE_IMPORT_PATH's. Each must be a directory."""
    dirs = [Path.cwd()] if working_directory else []
    dirs += flags or []
    return dirs + settings.import_path()


def extend_sys_path(dirs: list[Path]) -> None:
    for directory in reversed(dirs):
        entry = str(directory.resolve())
        if entry not in sys.path:
            sys.path.insert(0, entry)


def handler_problem(path: str) -> str | None:
    """Why the worker could not run ``module:function``, in one line; None when it can."""
    from hookline.worker.processing import load_handler

    try:
        load_handler(path)
    except (Exception, SystemExit) as exc:  # the module's own code runs here: any error it raises
        first_line = (str(exc).strip().splitlines() or [""])[0]
        problem = f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__
        if isinstance(exc, ImportError):
            problem += f" (handlers are imported from the working directory, --import-path DIR and {IMPORT_PATH_ENV})"
        return problem
    return None
