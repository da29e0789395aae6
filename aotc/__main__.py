import sys

from aotc.cli import main

sys.exit(main())
