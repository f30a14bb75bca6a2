"""The one list of Open MPI settings the test entries run under (tools/mpi_env), for the Python
tests that start mpiexec themselves."""
import os
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def mpi_env(run_dir_prefix=None):
    """This process's environment with tools/mpi_env's settings over it; with a prefix, a fresh
    SCALELAB_RUN_DIR for the watchdog's files."""
    env = dict(os.environ)
    with open(os.path.join(ROOT, "tools", "mpi_env")) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                key, value = line.split("=", 1)
                env[key] = value
    if run_dir_prefix:
        env["SCALELAB_RUN_DIR"] = tempfile.mkdtemp(prefix=run_dir_prefix)
    return env
