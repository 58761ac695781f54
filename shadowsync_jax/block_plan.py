"""How many training steps each dispatch runs: blocks of K steps, cut where an event falls (docs/design.md §13).

  plan = block_plan.BlockPlan(steps_per_dispatch='auto', stop_step=7812, max_steps=64)
  step = 0
  while step < plan.stop_step:
    n = plan.next_block(step, due_steps=[driver.next_due(step), recovery.next_due(step), log.next_due(step)])
    ...                                    # one dispatch of n steps; while probing, wait for it and time it
    if plan.probing:
      plan.observe(n, seconds)
    step += n
  plan.steps_per_dispatch                  # K, once chosen

A block ends at the earliest of K steps, the stop, and the next step at whose boundary a hook must act (a log step, a
checkpoint, a foreground round, an emulated failure, a kill): events happen at block boundaries, so a run gives the same
results whatever K is. The first block is one step (it compiles). With `steps_per_dispatch='auto'` the next blocks
probe: one step, then `PROBE_STEPS`, three times, each waited for and timed, its data read inside its time (nothing
is read ahead while the probe runs: a block of one size read beside a block of the other made the fit mistake one
for the other). A block of n steps takes about h + n t (h: the host's own work per dispatch, reading and placing
the batches, dispatching; t: a step, its data's share included). The fastest block of each size gives the fit
(`fit_host_and_step`); the second fastest says how far the probe's noise could have moved it: K is chosen from h's
upper bound (`host_upper_bound`: the fit plus that noise, at most the fastest one-step block, which holds h and a
step), so that a busy moment can choose a K too large, never one whose dispatches the host's work swamps. K is the
smallest power of two whose dispatch is long enough that that bound is at most `HOST_SHARE` of it: K t >=
h / HOST_SHARE (Keras's `steps_per_execution`, chosen by measurement). Pure bookkeeping: the training loop times
the blocks, and every process of a job, given the same events, plans the same blocks (the probe's sizes are fixed;
a job agrees on K by taking the largest any process chose, `agree`).
"""

from collections.abc import Iterable
import math

HOST_SHARE = 0.05  # The host's work per dispatch, as a share of the dispatch, that 'auto' allows.
PROBE_STEPS = 8  # The longer of the two block sizes 'auto' times.
PROBE = (1, PROBE_STEPS) * 3  # The timed blocks after the compiling one, in order.
MAX_STEPS = 256  # The longest block 'auto' chooses,
MAX_BLOCK_EXAMPLES = 2**20  # and at most this many of a process's examples a block (`max_steps_for`).


def steps_until_chosen(steps_per_dispatch: int | str) -> int:
  """Steps from a run's start until its K is in use: the compiling block, and 'auto''s probe (its blocks uncut)."""
  return 1 + (sum(PROBE) if steps_per_dispatch == 'auto' else 0)


def blocks_until_chosen(steps_per_dispatch: int | str) -> int:
  """Blocks from a run's start until its K is in use: the compiling one, and 'auto''s probe (the last compiles K)."""
  return 1 + (len(PROBE) if steps_per_dispatch == 'auto' else 0)


def choose_steps_per_dispatch(host_s: float, step_s: float, max_steps: int, host_share: float = HOST_SHARE) -> int:
  """The smallest power of two K with K step_s >= host_s / host_share, at most `max_steps` (and at least 1)."""
  if host_s <= 0:
    return 1
  if step_s <= 0:
    return max_steps
  needed = host_s / host_share / step_s
  return max(1, min(max_steps, 2 ** math.ceil(math.log2(max(needed, 1.0)))))


def max_steps_for(examples_per_step: int) -> int:
  """The longest block 'auto' may choose when a step holds `examples_per_step` of this process's examples:
  `MAX_STEPS`, and at most `MAX_BLOCK_EXAMPLES` examples (a power of two). A block sits in host memory twice (the
  one placed, the one read ahead) and once on the device, ~170 bytes an example: a GPU-sized batch of 16,384 at
  256 steps a block held 0.7 GB a copy, where 64 steps already keep the dispatch's own cost small."""
  fitting = max(1, MAX_BLOCK_EXAMPLES // max(1, examples_per_step))
  return min(MAX_STEPS, 1 << (fitting.bit_length() - 1))


def _by_size(timings: Iterable[tuple[int, float]]) -> dict[int, list[float]]:
  """The timed blocks' seconds by their steps, fastest first; at least two sizes."""
  by_size: dict[int, list[float]] = {}
  for n, seconds in timings:
    by_size.setdefault(n, []).append(seconds)
  if len(by_size) < 2:
    raise ValueError(f'blocks of at least two sizes are needed, got {sorted(by_size)}.')
  return {n: sorted(seconds) for n, seconds in by_size.items()}


def _line(by_size: dict[int, list[float]]) -> tuple[float, float]:
  """(h, t), either may be below 0: the line through the fastest block of the fewest and of the most steps."""
  small, large = min(by_size), max(by_size)
  step_s = (by_size[large][0] - by_size[small][0]) / (large - small)
  return by_size[small][0] - small * step_s, step_s


def fit_host_and_step(timings: Iterable[tuple[int, float]]) -> tuple[float, float]:
  """(h, t) of blocks of n steps taking about h + n t seconds, from timed (n, seconds) pairs of at least two sizes:
  the fastest time at each size (noise only adds: a busy moment, a first run's page faults), the line through the
  smallest and the largest size; neither below 0 (no step time: h is the fastest block of the fewest steps)."""
  by_size = _by_size(timings)
  host_s, step_s = _line(by_size)
  if step_s <= 0:
    return by_size[min(by_size)][0], 0.0
  return max(0.0, host_s), step_s


def host_upper_bound(timings: Iterable[tuple[int, float]]) -> float:
  """How long the host's work per dispatch (h) may be, given the noise of the timed blocks: the fitted h plus how
  far noise could have moved it, at most the fastest block of the fewest steps (it holds h and a step). Noise: what
  the gap between the fastest and the second fastest block of each size moves the fit by, and the fit's own reach
  below 0 (a host that does less than nothing is an error of at least that much). The timings are noisy (on a busy
  2-core machine the blocks of one size spread by half their time): an h fitted near 0 from them is no sign that
  the host does nothing, and K chosen from it would be 1."""
  by_size = _by_size(timings)
  small, large = min(by_size), max(by_size)
  gap = {n: seconds[1] - seconds[0] if len(seconds) > 1 else 0.0 for n, seconds in by_size.items()}
  host_s, _ = _line(by_size)  # h = (L s_S - S s_L) / (L - S): a gap at S moves it L / (L - S) of the gap.
  moved = (large * gap[small] + small * gap[large]) / (large - small) + max(0.0, -host_s)
  return min(by_size[small][0], max(0.0, host_s) + moved)


def next_multiple(step: int, every: int | None) -> int | None:
  """The first multiple of `every` after `step` (None: never): when an event every `every` steps is next due."""
  if not every:
    return None
  return (step // every + 1) * every


class BlockPlan:
  """The size of each dispatch (module docstring)."""

  def __init__(self, steps_per_dispatch: int | str, stop_step: int, max_steps: int = MAX_STEPS):
    """`steps_per_dispatch`: K, or 'auto' (measured at the start, at most `max_steps`); `stop_step`: where the
    run stops."""
    if steps_per_dispatch != 'auto' and not (isinstance(steps_per_dispatch, int) and steps_per_dispatch >= 1):
      raise ValueError(f"steps_per_dispatch={steps_per_dispatch!r} must be an integer >= 1 or 'auto'.")
    self.stop_step = stop_step
    self.max_steps = max_steps
    self._auto = steps_per_dispatch == 'auto'
    self.steps_per_dispatch: int | None = None if self._auto else steps_per_dispatch
    self._blocks = 0  # Blocks planned so far.
    self._timings: list[tuple[int, float]] = []
    self.host_s: float | None = None  # What 'auto' measured: the host's work per dispatch, a step, and how long
    self.step_s: float | None = None  # the host's work may be given the probe's noise (what K is chosen from).
    self.host_bound_s: float | None = None

  @property
  def probing(self) -> bool:
    """Whether the block just planned is one of 'auto''s timed blocks: the loop waits for it and `observe`s it."""
    return self._auto and self.steps_per_dispatch is None and 1 < self._blocks <= 1 + len(PROBE)

  @property
  def block_steps(self) -> int:
    """The most steps a block holds: K once known, else the longest block the probe runs."""
    return self.steps_per_dispatch or max(PROBE)

  def next_block(self, step: int, due_steps: Iterable[int | None] = ()) -> int:
    """Steps of the next block from `step`: K (or the probe's next size), cut at the stop and at the first due
    step after `step`."""
    if step >= self.stop_step:
      raise ValueError(f'no block after step {step}: the run stops at {self.stop_step}.')
    self._blocks += 1
    return self._cut(step, self._wanted(self._blocks), due_steps)

  def peek(self, step: int, due_steps: Iterable[int | None] = ()) -> int:
    """The steps `next_block` would plan from `step` now, without planning it: how many steps of data to read ahead
    for the block after the one just planned (a block cut short by an event needs no more)."""
    return self._cut(step, self._wanted(self._blocks + 1), due_steps)

  def _wanted(self, block: int) -> int:
    """Steps the `block`-th block (from 1) holds before events cut it."""
    if block == 1:
      return 1  # It compiles.
    if self.steps_per_dispatch is None and block - 2 < len(PROBE):
      return PROBE[block - 2]
    return self.steps_per_dispatch or max(PROBE)

  def _cut(self, step: int, wanted: int, due_steps: Iterable[int | None]) -> int:
    end = min([step + wanted, self.stop_step] + [due for due in due_steps if due is not None and due > step])
    return end - step

  def observe(self, steps: int, seconds: float) -> None:
    """A probing block of `steps` steps took `seconds`, from its data to its results; after the last, K is chosen."""
    self._timings.append((steps, seconds))
    if len(self._timings) < len(PROBE):
      return
    sizes = {n for n, _ in self._timings}
    if len(sizes) < 2:  # Events cut every probe block to one size: nothing to fit, keep the longest block.
      self.steps_per_dispatch = max(PROBE)
      return
    self.host_s, self.step_s = fit_host_and_step(self._timings)
    self.host_bound_s = host_upper_bound(self._timings)
    self.steps_per_dispatch = choose_steps_per_dispatch(self.host_bound_s, self.step_s, self.max_steps)

  def agree(self, chosen_by_process: Iterable[int]) -> None:
    """The job's K: the largest any process chose (every process must dispatch the same blocks)."""
    self.steps_per_dispatch = max(chosen_by_process)

  def stats(self) -> dict[str, float | int | None]:
    """steps_per_dispatch, and what 'auto' measured (dispatch_host_s, dispatch_step_s, dispatch_host_bound_s)."""
    return {
      'steps_per_dispatch': self.steps_per_dispatch,
      'dispatch_host_s': self.host_s,
      'dispatch_step_s': self.step_s,
      'dispatch_host_bound_s': self.host_bound_s,
    }
