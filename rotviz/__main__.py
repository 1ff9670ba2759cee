import sys

from rotviz.cli import main

sys.exit(main())
