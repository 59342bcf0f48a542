import sys

from ternary.cli import main

sys.exit(main())
