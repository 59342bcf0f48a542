import sys

from ternary.cli import main

# guarded: tools that start workers with multiprocessing's spawn (tp-kernels) re-import the
# main module in each worker
if __name__ == "__main__":
    sys.exit(main())
