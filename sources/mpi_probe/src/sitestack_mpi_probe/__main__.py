import os
import sys

from . import executable

os.execv(executable(), [executable(), *sys.argv[1:]])
