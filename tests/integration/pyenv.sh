# A Python virtual environment for the integration tests that need
# packages from PyPI, at $VOLLEY_PYENV (under the build directory, one for
# all of them). Sourced after lib.sh.

# it_pyenv NAME==VERSION...: makes sure the environment holds each package
# at its pinned version, making it and installing them from PyPI when it
# does not, and sets PYENV to it. Fails the test when they cannot be had.
it_pyenv() {
  PYENV=${VOLLEY_PYENV:?}
  if [ -x "$PYENV/bin/python" ] && "$PYENV/bin/python" - "$@" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
sys.exit(any(version(n) != v for n, _, v in (r.partition("==") for r in sys.argv[1:])))
PY
    return 0
  fi
  python3 -m venv --system-site-packages "$PYENV" || fail "cannot make a Python virtual environment"
  "$PYENV/bin/python" -m pip install -q --disable-pip-version-check "$@" \
    || fail "cannot install $* (the test needs PyPI once)"
}
