import sys

from diffscale.cli import main

sys.exit(main())
