"""What a training process holds in memory: its state's bytes, its peak resident memory, and whether a state fits.

  needed = memory.state_bytes(abstract_state_L)          # bytes of a tree of arrays or shapes (this process's part)
  memory.summary(needed)                                 # summary.json: every process's state and peak memory
  problem = memory.shortfall(needed, hosts=distributed_hostnames)   # None, or what is missing, in words
  memory.peak_rss_bytes()                                 # this process's high-water mark of resident memory

docs/design.md §4: a process's peak memory stays within 1.5x the state it holds plus a fixed margin. A state that
cannot fit is refused before anything is allocated: on a CPU the devices' memory is the host's, shared by every
process of the job on that host, so the processes of one host add up; on an accelerator each device holds its own
part.
"""

from collections.abc import Sequence
import math
import os
from typing import Any

import jax

from shadowsync_jax.parallel import distributed

RUNTIME_BYTES = 1 << 30  # What a training process holds besides its state: JAX and XLA, programs, batches, buffers.


def state_bytes(tree: Any) -> int:
  """Bytes of every array (or shape) in `tree`, as this process holds them."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      total += sum(shard.data.nbytes for shard in leaf.addressable_shards)
    else:
      total += math.prod(leaf.shape) * leaf.dtype.itemsize
  return total


def summary(state_bytes_here: int) -> dict[str, list[int]]:
  """summary.json's `state_bytes` (the train state each process holds) and `peak_rss_bytes` (each one's peak
  resident memory so far), every process's, in process order: a synchronization point of the job."""
  everyone = distributed.exchange('memory_summary', [state_bytes_here, peak_rss_bytes()])
  return {'state_bytes': [e[0] for e in everyone], 'peak_rss_bytes': [e[1] for e in everyone]}


def peak_rss_bytes() -> int:
  """This process's peak resident memory so far (VmHWM, what `/usr/bin/time -v` reports at its end)."""
  return _status_bytes('VmHWM')


def rss_bytes() -> int:
  """This process's resident memory now."""
  return _status_bytes('VmRSS')


def available_host_bytes() -> int:
  """Memory the kernel could give new allocations on this host without swapping (MemAvailable)."""
  with open('/proc/meminfo', encoding='ascii') as meminfo:
    for line in meminfo:
      if line.startswith('MemAvailable:'):
        return int(line.split()[1]) * 1024
  raise OSError('/proc/meminfo has no MemAvailable line.')


def device_bytes_limit() -> int | None:
  """Bytes one accelerator device of this process can hold (None on a CPU, whose memory is the host's)."""
  device = jax.local_devices()[0]
  if device.platform == 'cpu':
    return None
  stats = device.memory_stats() or {}
  return stats.get('bytes_limit')


def shortfall(needed_per_process: Sequence[int], hosts: Sequence[str], this_process: int) -> str | None:
  """None if the processes' states fit: on a CPU, the states of the processes on this process's host (`hosts[p]`
  names each process's host) plus `RUNTIME_BYTES` each within the host's available memory; on an accelerator, this
  process's state within its devices. Otherwise a sentence saying what is needed and what there is."""
  limit = device_bytes_limit()
  if limit is not None:
    per_device = needed_per_process[this_process] / max(1, jax.local_device_count())
    if per_device <= limit:
      return None
    return f'needs {gb(per_device)} on each device of process {this_process}, which holds {gb(limit)}'
  same_host = [p for p, host in enumerate(hosts) if host == hosts[this_process]]
  needed = sum(needed_per_process[p] + RUNTIME_BYTES for p in same_host)
  available = available_host_bytes()
  if needed <= available:
    return None
  processes = f'its {len(same_host)} processes on this host' if len(same_host) > 1 else 'the process'
  return (
    f'needs {gb(needed)} for {processes} ({gb(sum(needed_per_process[p] for p in same_host))} of train state, '
    f'{gb(RUNTIME_BYTES)} each for the runtime), and this host has {gb(available)} available'
  )


def gb(num_bytes: float) -> str:
  return f'{num_bytes / 1e9:.2f} GB'


def _status_bytes(field: str) -> int:
  with open(f'/proc/{os.getpid()}/status', encoding='ascii') as status:
    for line in status:
      if line.startswith(field + ':'):
        return int(line.split()[1]) * 1024
  raise OSError(f'/proc/self/status has no {field} line.')
