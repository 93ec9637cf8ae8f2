"""Running an absl-flag tool with flags of its own.

Each tool keeps its flags in its own ``flags.FlagValues`` (``FLAGS`` in the
tool's module), so several tools (and their tests) live in one process
without clashing flag names; this module parses them and runs the tool's
``main``, like ``absl.app.run`` does for the global flags.
"""

import sys
from typing import Callable

from absl import flags
from absl import logging

_HELP = ("--help", "-h", "--helpfull", "--helpshort", "-?")


def run(main: Callable[[list[str]], int], flag_values: flags.FlagValues,
        doc: str | None = None, argv: list[str] | None = None) -> None:
  """Parses ``argv`` into ``flag_values``, runs ``main``, exits with its status.

  Args:
    main: ``argv -> exit status``; reads the tool's flags.
    flag_values: the tool's own flags.
    doc: text printed above the flags by ``--help`` / ``--helpfull``.
    argv: command line (default ``sys.argv``).
  """
  argv = list(sys.argv if argv is None else argv)
  if any(a in _HELP for a in argv[1:]):
    print((doc or "").strip() + "\n\nflags:\n" + flag_values.get_help())
    sys.exit(0)
  try:
    rest = flag_values(argv)
  except flags.Error as e:
    print(f"error: {e}\nPass --help to list this tool's flags.",
          file=sys.stderr)
    sys.exit(2)
  logging.use_absl_handler()
  logging.set_verbosity(logging.WARNING)
  sys.exit(main(rest))
