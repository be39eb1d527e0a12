"""torchrun_main.py that SIGKILLs itself inside its Nth checkpoint save: every file of the checkpoint is written into
its temp folder, which is not yet renamed into place. It is the kill a power cut or an OOM killer would deal
mid-save, made deterministic for tests/training/test_faults.py.

    python tests/kill_during_save.py N <torchrun_main.py flags>
"""

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torchrun_main  # noqa: E402
from galore_plumage.training import checkpoint  # noqa: E402

KILL_AT = int(sys.argv[1])
saves = 0
sync_folder = checkpoint._fsync_tree


def sync_then_die(folder: Path) -> None:
    global saves
    sync_folder(folder)
    if folder.name.startswith(".model_"):  # the checkpoint's own folder, not a subfolder the sync recurses into
        saves += 1
        if saves == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)


checkpoint._fsync_tree = sync_then_die
sys.exit(torchrun_main.main(sys.argv[2:]))
