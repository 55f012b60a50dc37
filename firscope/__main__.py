"""``python -m firscope``: the command line (see :mod:`firscope.cli`)."""
import sys

try:  # ctrl+c this early is an interruption like any other, not a traceback
    from .cli import main

    code = main()
except KeyboardInterrupt:
    sys.stderr.write("firscope: interrupted\n")
    code = 130
sys.exit(code)
