import os
import sys

# Tests import the installed package, never the source folder beside them
# (which has no compiled module).
_here = os.path.dirname(os.path.abspath(__file__))
_src = os.path.dirname(_here)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _src]
