"""Which devices a run trains on: ``--devices auto | cpu | cpu:N | gpu | gpu:N``.

``cpu:N`` splits the host CPU into N logical devices and mirrors the model over them, so the
multi-device path (MirroredStrategy: per-replica batches, cross-replica gradient sum) runs
and is tested on any machine, not first on a user's GPUs. Logical devices can only be set
before TensorFlow initialises its devices (the first op, dataset or device listing):
``configure`` is therefore called by the command lines first thing, and a second call
with another layout in the same process is an error rather than a silent single device.
The device layout is a property of the machine, not of the experiment: it is not part of
the run's config, and a run checkpointed on N devices resumes on any other count.
"""
from __future__ import annotations

import dataclasses
import re

import tensorflow as tf

_SPEC = re.compile(r"^(auto|cpu|gpu)(?::([1-9][0-9]*))?$")


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """A parsed --devices value: kind ('auto', 'cpu', 'gpu') and count (None: every device of the kind)."""

    kind: str
    count: int | None = None

    def __str__(self) -> str:
        return self.kind if self.count is None else f"{self.kind}:{self.count}"


def parse(value: str | None) -> DeviceSpec:
    """'cpu:2' -> DeviceSpec('cpu', 2); None or 'auto' -> every GPU if any, else the CPU."""
    match = _SPEC.match((value or "auto").strip().lower())
    if not match or (match.group(1) == "auto" and match.group(2)):
        raise ValueError(f"--devices {value!r}: expected auto, cpu, cpu:N, gpu or gpu:N (N >= 1)")
    return DeviceSpec(match.group(1), int(match.group(2)) if match.group(2) else None)


def configure(spec: DeviceSpec | str | None) -> list[str]:
    """Creates the logical devices `spec` needs (cpu:N splits the CPU) and returns their names."""
    spec = spec if isinstance(spec, DeviceSpec) else parse(spec)
    if spec.kind == "cpu" and spec.count and spec.count > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        wanted = [tf.config.LogicalDeviceConfiguration() for _ in range(spec.count)]
        current = tf.config.get_logical_device_configuration(cpu)
        if current is None or len(current) != spec.count:
            try:
                tf.config.set_logical_device_configuration(cpu, wanted)
            except RuntimeError:
                have = len(tf.config.list_logical_devices("CPU"))
                if have < spec.count:
                    raise RuntimeError(
                        f"--devices {spec}: TensorFlow already initialised {have} CPU device(s) in this process; "
                        "choose the devices before any TensorFlow work (a fresh process)") from None
    return device_names(spec)


def device_names(spec: DeviceSpec | str | None) -> list[str]:
    """The logical device names a spec selects, e.g. ['/device:CPU:0', '/device:CPU:1']."""
    spec = spec if isinstance(spec, DeviceSpec) else parse(spec)
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    if spec.kind == "auto":
        return gpus or cpus[:1]
    pool = gpus if spec.kind == "gpu" else cpus
    count = spec.count or (len(pool) if spec.kind == "gpu" else 1)
    if len(pool) < count:
        raise RuntimeError(f"--devices {spec}: only {len(pool)} {spec.kind.upper()} device(s) visible")
    return pool[:count]


def strategy(spec: DeviceSpec | str | None = None) -> tf.distribute.Strategy:
    """MirroredStrategy over several selected devices; one named device pinned; auto alone: the default."""
    names = configure(spec)
    if len(names) > 1:
        # Explicit reduction on the host: NCCL only exists between GPUs.
        cross = None if all("GPU" in n for n in names) else tf.distribute.ReductionToOneDevice()
        return tf.distribute.MirroredStrategy(names, cross_device_ops=cross)
    spec = spec if isinstance(spec, DeviceSpec) else parse(spec)
    if spec.kind != "auto":  # an explicit choice: pin it (cpu on a GPU machine means the CPU)
        return tf.distribute.OneDeviceStrategy(names[0])
    return tf.distribute.get_strategy()
