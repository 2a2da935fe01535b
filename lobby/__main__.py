import sys

from lobby.cli import main

sys.exit(main())
