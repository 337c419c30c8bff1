"""Run a command the way a kubelet would run a hardened engine container, without a container runtime.

Run as root under `unshare --mount --propagation private` (a private mount namespace: nothing here is
seen outside it). Given the security-relevant part of a rendered pod (`PodSandbox`), it

1. makes the root filesystem read-only for this namespace (`readOnlyRootFilesystem`),
2. mounts a fresh tmpfs at each emptyDir volume's mount path (mode 0777, group fsGroup, as an
   emptyDir is), so those are the only writable paths,
3. makes the "image" the engine needs readable by its user: the folders named `readable` (the
   Python venv, its base interpreter, the model) stay where they are, and a parent the user cannot
   enter (root's 0700 home, where this machine keeps them) is replaced by an empty read-only tmpfs
   holding just those folders, read-only; an image built for non-root has such files world-readable,
4. then execs the command through `setpriv` as `runAsUser`/`runAsGroup` with fsGroup as the only
   supplementary group, no new privileges (`allowPrivilegeEscalation: false`), every capability
   dropped (inheritable, ambient and bounding sets), only the container's environment, and the
   container's working directory (the image's: "/" here).

The seccomp profile (RuntimeDefault) is the one part of the pod's security context not applied.

Usage: `unshare --mount --propagation private -- python pod_sandbox.py SANDBOX.json`.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

# Where the readable folders wait while the tree above them is rebuilt: the first of these that
# exists and is unrelated to every path involved (overmounted in this namespace only).
STAGING_CANDIDATES = ("/mnt", "/media", "/srv", "/var/tmp")


@dataclass(frozen=True)
class Volume:
    path: str
    size: str | None = None  # tmpfs size, e.g. "16g"; None: the tmpfs default


@dataclass(frozen=True)
class PodSandbox:
    argv: list[str]
    env: dict[str, str]
    uid: int
    gid: int
    fs_group: int | None
    read_only_root: bool
    volumes: list[Volume]
    readable: list[str]
    working_dir: str = "/"

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @staticmethod
    def load(path: Path) -> PodSandbox:
        raw = json.loads(path.read_text())
        raw["volumes"] = [Volume(**v) for v in raw["volumes"]]
        return PodSandbox(**raw)


def _mount(*args: str) -> None:
    subprocess.run(["mount", "--no-mtab", *args], check=True)


def _related(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def _hidden_ancestor(path: Path) -> Path | None:
    """The topmost folder above `path` that others may not enter, if any."""
    for folder in reversed(path.parents):
        if folder != Path("/") and not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


def prepare(box: PodSandbox) -> None:
    readable = [Path(p).resolve() for p in box.readable]
    volumes = sorted(box.volumes, key=lambda v: len(Path(v.path).parts))
    involved = [*readable, *(Path(v.path) for v in volumes)]
    staging = next(
        Path(c)
        for c in STAGING_CANDIDATES
        if Path(c).is_dir() and not any(_related(Path(c), p) for p in involved)
    )
    _mount("-t", "tmpfs", "-o", "mode=0700", "tmpfs", str(staging))
    for i, folder in enumerate(readable):
        slot = staging / str(i)
        slot.mkdir()
        _mount("--bind", str(folder), str(slot))
        _mount("-o", "remount,bind,ro", str(slot))
    # A readable folder inside a volume gets fresh parents there (made below, enterable by all).
    outside = [p for p in readable if not any(_related(Path(v.path), p) for v in volumes)]
    hidden = sorted({a for p in outside if (a := _hidden_ancestor(p)) is not None})
    for folder in hidden:
        _mount("-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(folder))
    if box.read_only_root:
        _mount("-o", "remount,bind,ro", "/")
    for volume in volumes:
        Path(volume.path).mkdir(parents=True, exist_ok=True)
        options = "mode=0777" + (f",gid={box.fs_group}" if box.fs_group is not None else "")
        options += f",size={volume.size}" if volume.size else ""
        _mount("-t", "tmpfs", "-o", options, "tmpfs", volume.path)
    for i, folder in enumerate(readable):
        folder.mkdir(parents=True, exist_ok=True)
        _mount("--move", str(staging / str(i)), str(folder))
    for folder in hidden:
        _mount("-o", "remount,ro", str(folder))
    subprocess.run(["umount", "--no-mtab", str(staging)], check=True)


def setpriv_argv(box: PodSandbox) -> list[str]:
    groups = str(box.fs_group) if box.fs_group is not None else ""
    return [
        "setpriv",
        f"--reuid={box.uid}",
        f"--regid={box.gid}",
        *([f"--groups={groups}"] if groups else ["--clear-groups"]),
        "--no-new-privs",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--bounding-set=-all",
        "--",
        *box.argv,
    ]


def main() -> None:
    box = PodSandbox.load(Path(sys.argv[1]))
    prepare(box)
    # The image's working directory, not the caller's (which may now be hidden under a volume: vLLM's
    # spawned engine core changes into its parent's folder and dies if that is gone).
    os.chdir(box.working_dir)
    argv = setpriv_argv(box)
    os.execvpe(argv[0], argv, box.env)  # same PID: the caller's process is the engine


if __name__ == "__main__":
    main()
