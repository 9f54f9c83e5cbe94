"""Real filesystems for the disk-fault tests (root only, as the tests and CI run): a small
tmpfs, or an ext4 image on a loop device that can be made to fail.

Every mount is unmounted when its context ends (lazily if something still holds it), so a
failed test leaves nothing mounted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

#: ``EXT4_IOC_SHUTDOWN`` (``_IOR('X', 125, __u32)``) and its "no log flush" flag: from
#: then on every read, write and fsync on the filesystem fails with EIO.
EXT4_IOC_SHUTDOWN: Final = 0x8004587D
EXT4_GOING_FLAGS_NOLOGFLUSH: Final = 2


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


def _unmount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextlib.contextmanager
def tmpfs(path: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted at ``path`` (made first)."""
    path.mkdir(parents=True, exist_ok=True)
    _run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    try:
        yield path
    finally:
        _unmount(path)


class Ext4:
    """An ext4 filesystem in an image file, mounted from a loop device at ``path``."""

    def __init__(self, image: Path, path: Path) -> None:
        self.image = image
        self.path = path

    def mount(self) -> None:
        # errors=remount-ro: an error the filesystem finds makes it read-only (EROFS).
        _run("mount", "-o", "loop,errors=remount-ro", str(self.image), str(self.path))

    def unmount(self) -> None:
        _unmount(self.path)

    @property
    def device(self) -> str:
        """The loop device's name (``loop3``)."""
        out = subprocess.run(["findmnt", "-no", "SOURCE", str(self.path)], check=True,
                             capture_output=True, text=True).stdout.strip()
        return os.path.basename(out)

    def make_read_only(self) -> None:
        """Have ext4 find an error: with ``errors=remount-ro`` it turns read-only, and
        every write and fsync fails with EROFS (until it is mounted again)."""
        with open(f"/sys/fs/ext4/{self.device}/trigger_fs_error", "w") as f:
            f.write("figtank test: a disk fault\n")

    def shut_down(self) -> None:
        """Shut the filesystem down: every write and fsync fails with EIO (until it is
        mounted again), as on a failing disk."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
        finally:
            os.close(fd)


@contextlib.contextmanager
def ext4(path: Path, size: int) -> Iterator[Ext4]:
    """An ext4 image of ``size`` bytes (no blocks reserved for root) beside ``path``,
    mounted at ``path``; unmounted, and its image removed, at the end."""
    image = path.with_name(path.name + ".img")
    with open(image, "wb") as f:
        f.truncate(size)
    _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
    path.mkdir(parents=True, exist_ok=True)
    fs = Ext4(image, path)
    fs.mount()
    try:
        yield fs
    finally:
        fs.unmount()
        image.unlink(missing_ok=True)


def fill(path: Path, leave: int) -> Path:
    """Write a filler file at ``path`` until its filesystem has ``leave`` bytes free (or
    a little less: whole blocks); the file, to remove to free the space again."""
    st = os.statvfs(path.parent)
    free = st.f_bavail * st.f_frsize
    size = max(free - leave, 0)
    with open(path, "wb") as f:
        chunk = bytes(1 << 20)
        while size > 0:
            size -= f.write(chunk[:min(size, len(chunk))])
        f.flush()
        os.fsync(f.fileno())
    return path


def free_bytes(path: Path) -> int:
    """Bytes free to unprivileged writers on ``path``'s filesystem."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
