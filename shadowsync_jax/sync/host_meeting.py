"""How a shadow round's processes meet on the host, with no collective of the job (`algorithms.met_rounds`): each
round's agreement on whether every process is done and on the job's pace (`round_agreement`), and the mean of the
replicas' contributions (`job_mean`): this process's replicas summed on the host (`host_sum`), every process's sum
met over direct connections between the processes (`sums_meeting`, `parallel.peer_links`). In one process, its own.

  links = peer_links(meshes)                                              # one set of connections for both
  agree, meet = round_agreement(meshes, links), sums_meeting(meshes, links)
  all_done, interval_s = agree(done, interval_s, stopped)                 # None if stopped while a peer was awaited
  mean = job_mean(meet, contributions_L, num_replicas, stopped)           # None likewise
"""

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from shadowsync_jax.parallel import distributed
from shadowsync_jax.parallel import peer_links as peer_links_lib
from shadowsync_jax.parallel import replicas

PyTree = Any


def peer_links(meshes: replicas.ReplicaMeshes) -> peer_links_lib.PeerLinks | None:
  """The connections a driver's rounds meet over (None in one process: nothing to meet)."""
  return None if meshes.job is meshes.local else distributed.peer_links('shadow_rounds')


def round_agreement(meshes: replicas.ReplicaMeshes, links: peer_links_lib.PeerLinks | None = None):
  """`agree(done, interval_s, stopped) -> (all_done, job_interval_s)`: whether every process of the job is done, and
  the longest of their paces (None if `stopped()` became true while a peer was awaited); over `links` (or links of
  its own) when there are several processes: a process waiting there for a late peer keeps training (a collective
  would hold its devices, and its steps behind it, for as long)."""
  if meshes.job is meshes.local:
    return lambda done, interval_s, stopped=None: (done, interval_s)
  links = links or peer_links(meshes)

  def agree(done: bool, interval_s: float, stopped=lambda: False) -> tuple[bool, float] | None:
    offers = links.meet(np.array([float(done), interval_s], np.float64), stopped)
    if offers is None:
      return None
    return all(bool(done) for done, _ in offers), float(max(interval_s for _, interval_s in offers))

  return agree


def host_sum(contributions_L: PyTree) -> PyTree:
  """This process's replicas' contributions to a round, read from its devices and summed on the host, replica
  after replica (no collective: `algorithms.met_rounds`)."""
  return jax.tree.map(lambda leaf: leaf.sum(axis=0), jax.device_get(contributions_L))


def sums_meeting(meshes: replicas.ReplicaMeshes, links: peer_links_lib.PeerLinks | None = None):
  """`meet(vector, stopped) -> vectors`: every process's sums of a round, over `links` (or links of its own;
  in one process, its own). No collective of the job: a process whose peer is late waits on the host, and its
  devices go on training (a round's collective held them, and every block queued behind it, until the peer's
  came: 0.13-0.15 s a round in a 2 x 4 job, paced 4-5 s apart)."""
  if meshes.job is meshes.local:
    return lambda vector, stopped: [vector]
  return (links or peer_links(meshes)).meet


def job_mean(
  meet: Callable[[np.ndarray, Callable[[], bool]], list[np.ndarray] | None],
  contributions_L: PyTree,
  num_replicas: int,
  stopped: Callable[[], bool],
) -> PyTree | None:
  """The mean over the job's replicas of their contributions, from this process's sum (of its replicas', read
  from its devices, in replica order) and every other process's, met on the host (None if `stopped()` became
  true while a peer was awaited): the same bits on every process, summed in process order."""
  leaves, treedef = jax.tree.flatten(host_sum(contributions_L))
  sums = meet(np.concatenate([np.ravel(leaf) for leaf in leaves]), stopped)
  if sums is None:
    return None
  total = sums[0].copy()
  for vector in sums[1:]:
    total += vector
  mean = total / np.float32(num_replicas)
  offsets = np.cumsum([0] + [leaf.size for leaf in leaves])
  pieces = [mean[a:b].reshape(leaf.shape) for leaf, a, b in zip(leaves, offsets[:-1], offsets[1:])]
  return jax.tree.unflatten(treedef, pieces)
