"""GPUs: how a host's devices are found, which of them each piece of work holds, and how the work learns it.

- Found without initializing CUDA in the driver (a process that has touched CUDA cannot fork, and CUDA_VISIBLE_DEVICES
  is read once, at CUDA's start): CUDA_VISIBLE_DEVICES when it is set, else `nvidia-smi`, else the driver's
  /proc/driver/nvidia/gpus directory, else none. A spec's `gpus=N` takes the first N of those, or, on a machine
  where none are found, declares N (as Ray's `num_gpus` does: that is how CI tests assignment without a device).
- Held as Ray holds them: a request below 1 takes that fraction of one device and shares it with other fractional
  work; 1 or more takes that many whole devices that no other running work holds (DevicePool).
- Told to the work: a process fray starts for it gets CUDA_VISIBLE_DEVICES (its devices, before it imports
  torch) and FRAY_GPUS (their ids); an in_memory thread gets them through `fray.current_gpus()` and its first
  device as its current CUDA device (`using_gpus`). A spec's `gpu_view=host` shows such a process every device
  of its host, its own first (so that `cuda:0` is still its own, and CUDA IPC reaches the others' memory).

Ids are the host's own numbers for its devices: nvidia-smi's index, or the entries of the driver's
CUDA_VISIBLE_DEVICES (where those are UUIDs or MIG names, their positions), as `ray.get_gpu_ids()` gives them.
- nvidia-smi numbers devices in PCI bus order, CUDA by default fastest first: where fray's ids are nvidia-smi's
  (or the driver's /proc list, also by bus), CUDA_DEVICE_ORDER=PCI_BUS_ID makes CUDA number them alike, in the
  processes fray starts and in the driver (set at discovery unless the driver set its own).
- Where a process is shown devices by UUID or MIG name, FRAY_GPU_IDS ("entry=id,...") tells it the host's id of
  each, which its own CUDA_VISIBLE_DEVICES cannot (a UUID's position there is not its id on the host).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fray.host import settings
from fray.runtime import current
from fray.runtime.current import held_from_env
from fray.runtime.resources import EPS

__all__ = [
    "ENV_HELD",
    "ENV_IDS",
    "GPU_VIEWS",
    "DevicePool",
    "HostGpus",
    "discover",
    "gpu_view",
    "held_from_env",
    "host_gpus",
    "no_gpus_env",
    "process_env",
    "use_held_device",
    "using_gpus",
]

ENV_HELD = settings.GPUS.name  # in a process fray started for work that holds GPUs: their ids, comma-separated
ENV_IDS = settings.GPU_IDS.name  # beside a CUDA_VISIBLE_DEVICES of UUIDs or MIG names: "entry=id,..." (the host's ids)
PCI_ORDER = "PCI_BUS_ID"  # CUDA_DEVICE_ORDER that numbers devices as nvidia-smi does
# What a process fray starts for work holding GPUs sees: "held", just its devices (the default); "host", every
# device of its host, its own first. CUDA IPC between processes on two devices needs the reader to see the
# producer's device (an RLHF trainer on one GPU sending weights to rollouts on another), as torchrun and Ray
# Train show each process every local device.
GPU_VIEWS = ("held", "host")
_NVIDIA_SMI_TIMEOUT = 10.0


@dataclass(frozen=True)
class HostGpus:
    """One host's GPUs as fray uses them: `ids` (the host's numbers), `entries` (what names each in
    CUDA_VISIBLE_DEVICES, in the same order) and where they were found (`source`)."""

    ids: tuple[int, ...] = ()
    entries: tuple[str, ...] = ()
    source: str = "none"
    order: str = ""  # the CUDA_DEVICE_ORDER under which entries that are numbers mean these devices ("": any)
    view: str = "held"  # GPU_VIEWS: what a process shown some of these devices sees besides them

    def __len__(self) -> int:
        return len(self.ids)

    def shown(self, ids: Sequence[int]) -> list[int]:
        """The devices a process fray starts for work on `ids` sees, in CUDA's order there: `ids`, each once
        (members sharing a device name it each, and CUDA refuses a variable that names one twice: "invalid
        device ordinal" at its first use), then, with the host view, the host's other devices."""
        shown = dict.fromkeys(ids)
        if self.view == "host":
            shown.update(dict.fromkeys(self.ids))
        return list(shown)

    def visible(self, ids: Sequence[int]) -> str:
        """The CUDA_VISIBLE_DEVICES value that shows the devices `shown(ids)`."""
        by_id = dict(zip(self.ids, self.entries, strict=True))
        return ",".join(by_id.get(i, str(i)) for i in self.shown(ids))

    def named(self, ids: Sequence[int]) -> str:
        """FRAY_GPU_IDS for a process shown `shown(ids)`: each entry that is not its id's own number, with that id
        ("" where every entry is: its CUDA_VISIBLE_DEVICES says the ids itself)."""
        by_id = dict(zip(self.ids, self.entries, strict=True))
        pairs = ((by_id.get(i, str(i)), i) for i in self.shown(ids))
        return ",".join(f"{entry}={i}" for entry, i in pairs if entry != str(i))

    def env(self, ids: Sequence[int]) -> dict[str, str]:
        """The variables that show a process fray starts exactly `ids` (CUDA_VISIBLE_DEVICES, and where needed
        CUDA_DEVICE_ORDER and FRAY_GPU_IDS)."""
        out = {"CUDA_VISIBLE_DEVICES": self.visible(ids)}
        if self.order:
            out["CUDA_DEVICE_ORDER"] = self.order
        named = self.named(ids)
        if named:
            out[ENV_IDS] = named
        return out

    @classmethod
    def numbered(cls, count: int, source: str, order: str = "") -> HostGpus:
        """`count` devices numbered from 0 (declared, where none are found: gpus=N)."""
        ids = tuple(range(count))
        return cls(ids, tuple(map(str, ids)), source, order)

    def ordinal(self, device: int) -> int | None:
        """`device`'s CUDA ordinal in this process (its place among the ids), or None if it is not one of them."""
        return self.ids.index(device) if device in self.ids else None


def _parse_visible(value: str, named: str = "", order: str = "") -> HostGpus:
    """The devices a CUDA_VISIBLE_DEVICES value shows. Entries are numbers, UUIDs ("GPU-...") or MIG names
    ("MIG-..."); `named` (FRAY_GPU_IDS) gives the host's id of such entries, else they are numbered by position.
    `order`: the process's CUDA_DEVICE_ORDER (what its numbers mean)."""
    entries = tuple(e.strip() for e in value.split(",") if e.strip())
    # CUDA stops at the first entry it cannot parse; "-1" or "" hides every device.
    if not entries or entries[0] == "-1":
        return HostGpus(source="CUDA_VISIBLE_DEVICES", order=order)
    ids_of = dict(_named_pair(item) for item in named.split(",") if "=" in item)
    ids = [ids_of.get(e, int(e) if e.isdigit() else None) for e in entries]
    if None not in ids and len(set(ids)) == len(ids):
        return HostGpus(tuple(i for i in ids if i is not None), entries, "CUDA_VISIBLE_DEVICES", order)
    return HostGpus(tuple(range(len(entries))), entries, "CUDA_VISIBLE_DEVICES", order)


def _named_pair(item: str) -> tuple[str, int | None]:
    entry, _, number = item.rpartition("=")
    return entry.strip(), int(number) if number.strip().isdigit() else None


def _parse_nvidia_smi(out: str) -> HostGpus:
    """`nvidia-smi --query-gpu=index --format=csv,noheader`'s devices: its indexes follow the PCI bus order."""
    ids = tuple(int(line) for line in out.split() if line.strip().isdigit())
    return HostGpus(ids, tuple(str(i) for i in ids), "nvidia-smi", PCI_ORDER)


def _from_nvidia_smi() -> HostGpus | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return _parse_nvidia_smi(out)


def _from_procfs() -> HostGpus | None:
    try:
        count = len(os.listdir("/proc/driver/nvidia/gpus"))  # (one directory per device, named by its bus id)
    except OSError:
        return None
    return HostGpus.numbered(count, "/proc/driver/nvidia/gpus", PCI_ORDER)


@functools.lru_cache(maxsize=8)
def _discover(visible: str | None, named: str, order: str) -> HostGpus:
    if visible is not None:
        return _parse_visible(visible, named, order)
    return _from_nvidia_smi() or _from_procfs() or HostGpus()


def discover() -> HostGpus:
    """This machine's GPUs as this process may use them, without initializing CUDA (cached). Found by nvidia-smi
    (or the driver's /proc list), they are numbered in PCI bus order: so is CUDA here from now on, where this
    process did not choose its CUDA_DEVICE_ORDER (see follow_host_order)."""
    environ = os.environ
    found = _discover(
        environ.get("CUDA_VISIBLE_DEVICES"), settings.GPU_IDS.read(environ), environ.get("CUDA_DEVICE_ORDER", "")
    )
    if found.order:
        follow_host_order(found)
    return found


def follow_host_order(found: HostGpus, environ: Any = os.environ) -> None:
    """Make this process's CUDA number devices as `found` does (CUDA_DEVICE_ORDER, read when CUDA starts here), or
    warn, once, where it cannot: the process chose another order, or its CUDA started already in another."""
    chosen = environ.get("CUDA_DEVICE_ORDER")
    if chosen == found.order:
        return
    torch = sys.modules.get("torch")
    started = torch is not None and getattr(getattr(torch, "cuda", None), "is_initialized", lambda: False)()
    if chosen is None and not started:
        environ["CUDA_DEVICE_ORDER"] = found.order
        return
    if not _warned_order:
        _warned_order.append(True)
        why = f"CUDA_DEVICE_ORDER={chosen}" if chosen is not None else "CUDA started here before fray found them"
        warnings.warn(
            f"fray: GPU ids here are {found.source}'s, in {found.order} order, but CUDA numbers devices otherwise in "
            f"this process ({why}): work run on this process's threads may use another device than it holds. "
            f"Set CUDA_DEVICE_ORDER={found.order} (or CUDA_VISIBLE_DEVICES) before starting",
            RuntimeWarning,
            stacklevel=3,
        )


_warned_order: list[bool] = []


def gpu_view(raw: Any) -> str:
    """A spec's `gpu_view=` (GPU_VIEWS), checked."""
    if raw not in GPU_VIEWS:
        raise ValueError(
            f"must be 'held' (a process fray starts for work holding GPUs sees just those: the default) or 'host' "
            f"(it sees every GPU of its host, its own first, for CUDA IPC between devices), got {raw!r}"
        )
    return str(raw)


def host_gpus(declared: float | None = None, view: str = "held") -> HostGpus:
    """The GPUs a spec's `gpus=` gives this host: all found (None), the first `declared` of them, or, where none
    are found, `declared` devices numbered from 0; shown to the work as `view` says (GPU_VIEWS). ValueError for
    a fraction, or more than the host has."""
    return dataclasses.replace(_host_gpus(declared), view=gpu_view(view))


def _host_gpus(declared: float | None) -> HostGpus:
    found = discover()
    if declared is None:
        return found
    if declared < 0 or not float(declared).is_integer():
        raise ValueError(
            f"gpus={declared:g}: a host's GPUs are whole devices; say gpus={math.floor(declared)} (work may still "
            "ask for a fraction of one device)"
        )
    count = int(declared)
    if not found.ids:
        return HostGpus.numbered(count, "declared")
    if count > len(found):
        raise ValueError(
            f"gpus={count}, but this host has {len(found)} GPU(s) (ids {list(found.ids)}, from {found.source}); "
            f"say gpus={len(found)} or fewer, or leave gpus out to use them all"
        )
    return HostGpus(found.ids[:count], found.entries[:count], found.source, found.order)


class DevicePool:
    """Which of a host's GPUs are free, and how much of each. Not thread-safe: its owner's lock guards it."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.free: dict[int, float] = {i: 1.0 for i in ids}

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(self.free)

    def choose(self, amount: float, among: Collection[int] | None = None) -> tuple[int, ...] | None:
        """The devices a request of `amount` GPUs would take now (None: it does not fit; () for no GPU).
        A fraction goes to the fullest device it fits on (fractions pack, leaving whole devices whole); whole
        devices are taken lowest id first. `among`: only those devices (a process that sees only them)."""
        if amount <= EPS:
            return ()
        candidates = [i for i in self.free if among is None or i in among]
        if amount < 1.0:
            fitting = [i for i in candidates if self.free[i] + EPS >= amount]
            return (min(fitting, key=lambda i: (self.free[i], i)),) if fitting else None
        whole = [i for i in candidates if self.free[i] >= 1.0 - EPS]
        count = round(amount)
        return tuple(whole[:count]) if len(whole) >= count else None

    def room(self, amount: float) -> float:
        """How many requests of `amount` GPUs fit in what is free now (inf for a request of none)."""
        if amount <= EPS:
            return math.inf
        if amount < 1.0:
            return float(sum(math.floor((free + EPS) / amount) for free in self.free.values()))
        return float(sum(1 for free in self.free.values() if free >= 1.0 - EPS) // round(amount))

    def take(self, amount: float, among: Collection[int] | None = None) -> tuple[int, ...] | None:
        """choose(), and hold them (None, holding nothing, if the request does not fit)."""
        ids = self.choose(amount, among)
        if ids:
            share = _share(amount)
            for i in ids:
                self.free[i] -= share
        return ids

    def give(self, ids: Sequence[int], amount: float) -> None:
        """Give back what take(amount) returned as `ids`."""
        share = _share(amount)
        for i in ids:
            if i in self.free:
                self.free[i] = min(1.0, self.free[i] + share)


def _share(amount: float) -> float:
    """What a request of `amount` GPUs takes of each device it holds."""
    return amount if amount < 1.0 else 1.0


def process_env(held: Sequence[int], host: HostGpus, visible: Sequence[int] | None = None) -> dict[str, str]:
    """The variables of a process fray starts for work holding the devices `held`: CUDA_VISIBLE_DEVICES shows
    `visible` (default: just `held`; an SPMD member sees its group's devices on its host, so that LOCAL_RANK
    indexes them) and FRAY_GPUS names `held`. Empty for work that holds no GPU (it inherits the driver's view)."""
    if not held:
        return {}
    return {**host.env(list(visible if visible is not None else held)), ENV_HELD: ",".join(str(i) for i in held)}


def no_gpus_env(host: HostGpus) -> dict[str, str]:
    """The variables of a process fray starts for work that holds no GPU on a host that has some: it sees none
    (CUDA_VISIBLE_DEVICES empty), so its CUDA never starts on a device that other work holds, and a CUDA value it
    reads arrives on the CPU, with a warning (fray.runtime.cuda_values). Empty on a host without GPUs."""
    return {"CUDA_VISIBLE_DEVICES": ""} if host.ids else {}


def using_gpus(held: Sequence[int], host: HostGpus) -> contextlib.AbstractContextManager[None]:
    """Run the block (a task or actor call on a thread of this process) as holding the devices `held`:
    `fray.current_gpus()` names them and, where torch sees CUDA, the first is this thread's current device
    (CUDA's current device is per thread; the previous one is restored after). Holding none costs a
    nullcontext: every in_memory actor call enters one."""
    return _holding(held, host) if held else _NOTHING


_NOTHING = contextlib.nullcontext()


@contextlib.contextmanager
def _holding(held: Sequence[int], host: HostGpus) -> Iterator[None]:
    token = current.push_gpus(tuple(held))
    restore = _set_cuda_device(host.ordinal(held[0]))
    try:
        yield
    finally:
        if restore is not None:
            restore()
        current.pop_gpus(token)


def _set_cuda_device(ordinal: int | None) -> Callable[[], None] | None:
    """Make `ordinal` this thread's current CUDA device; what restores the previous one (None: nothing set)."""
    torch = _torch_with_cuda()
    if torch is None or ordinal is None or ordinal >= torch.cuda.device_count():
        return None
    previous = torch.cuda.current_device()
    torch.cuda.set_device(ordinal)
    return lambda: torch.cuda.set_device(previous)


def _torch_with_cuda() -> Any:
    """torch, where it is installed and sees a CUDA device (imported here only for work that holds a GPU)."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return None
    # import_module, never sys.modules: while another thread imports torch, sys.modules holds it half made
    # (no torch.cuda yet); import_module waits for that import to finish
    torch: Any = importlib.import_module("torch")
    return torch if torch.cuda.is_available() else None


def use_held_device(environ: Mapping[str, str] = os.environ) -> None:
    """In a process fray started for work holding GPUs (FRAY_GPUS): make the first of them the current CUDA device
    of this thread, where torch sees CUDA. Nothing is imported or initialized for work that holds none."""
    held = held_from_env(environ)
    if held:
        seen = _parse_visible(environ.get("CUDA_VISIBLE_DEVICES", ""), settings.GPU_IDS.read(environ))
        _set_cuda_device(seen.ordinal(held[0]))
