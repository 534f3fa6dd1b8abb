"""Whether this machine hands free memory back to its host, and how the disk tier writes.

A virtual machine with virtio-balloon free page reporting gives every page it frees back
to its host, and each page it then takes again is a fault into the host: on the
benchmark machines a new page-cache page cost the disk tier's writer up to 24 ms of CPU
per 2 MiB entry, on the core the engine core shares. A full disk tier no longer frees
pages: it overwrites the files it evicts in place (``stores/spare_pool.py``), and the
benchmark starts its disk tier full (``disk_fill.py``). So the benchmark writes through
the page cache unless asked otherwise, and records what it chose and whether the machine
reports free pages (``results.json``, ``disk_writes``).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BALLOON_DEVICES", "DISK_WRITES", "disk_writes", "reports_free_pages"]

DISK_WRITES = ("page-cache", "direct")  # the default first
BALLOON_DEVICES = Path("/sys/bus/virtio/drivers/virtio_balloon")
REPORTING_FEATURE = 5  # VIRTIO_BALLOON_F_REPORTING: the device takes free page reports


def reports_free_pages(devices: Path = BALLOON_DEVICES) -> bool:
    """True if a virtio-balloon device here takes free page reports (the guest's features
    file: one character per feature bit, ``1`` where negotiated)."""
    try:
        features = [path.read_text() for path in devices.glob("virtio*/features")]
    except OSError:
        return False
    return any(bits[REPORTING_FEATURE : REPORTING_FEATURE + 1] == "1" for bits in features)


def disk_writes(choice: str, devices: Path = BALLOON_DEVICES) -> tuple[str, bool]:
    """How the run's disk tiers write, as text for the results, and ``direct_writes``."""
    if choice not in DISK_WRITES:
        raise ValueError(f"unknown disk writes {choice!r}; expected one of {DISK_WRITES}")
    reporting = "free page reporting" if reports_free_pages(devices) else "no free page reporting"
    if choice == "direct":
        return f"direct ({reporting})", True
    return f"page cache ({reporting})", False
