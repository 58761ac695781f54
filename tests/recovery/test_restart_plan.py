"""The restart plan: what each process restores and where its stream goes on, by hand for each mode."""

from shadowsync_jax.recovery import restart_plan

H = restart_plan.Holdings


def test_a_first_start_restores_nothing():
  plan = restart_plan.plan('partial', False, [H(), H()])
  assert plan.restore == [('init', 0), ('init', 0)] and plan.position == [0, 0]


def test_a_resume_takes_each_newest_checkpoint_or_for_lock_step_the_newest_common_one():
  holdings = [H(checkpoints=(500, 1000)), H(checkpoints=(500,))]  # Process 1 is slower: no checkpoint 1000 yet.
  free = restart_plan.plan('none', False, holdings)
  assert free.restore == [('checkpoint', 1000), ('checkpoint', 500)] and free.position == [1000, 500]
  lock_step = restart_plan.plan('none', True, holdings)
  assert lock_step.restore == [('checkpoint', 500)] * 2 and lock_step.position == [500, 500]


def test_full_recovery_rewinds_everyone_to_the_newest_common_checkpoint_and_ignores_live_states():
  holdings = [H(checkpoints=(16, 32), live=(45,), seen_peer_steps={1: 40}), H(checkpoints=(16,))]
  plan = restart_plan.plan('full', False, holdings)
  assert plan.restore == [('checkpoint', 16), ('checkpoint', 16)] and plan.position == [16, 16]
  assert plan.skipped(0) == plan.skipped(1) == 0
  assert restart_plan.plan('full', False, [H(checkpoints=(16,)), H()]).restore == [('init', 0), ('init', 0)]


def test_partial_recovery_keeps_the_survivor_and_moves_the_dead_process_to_where_it_died():
  # Process 1 died at step 40 (the launcher saw it there); process 0 saved its live state at step 45.
  holdings = [H(checkpoints=(16, 32), live=(45,), seen_peer_steps={0: 45, 1: 40}), H(checkpoints=(16, 32))]
  plan = restart_plan.plan('partial', False, holdings)
  assert plan.restore == [('live', 45), ('checkpoint', 32)] and plan.position == [45, 40]
  assert plan.skipped(0) == 0 and plan.skipped(1) == 8  # Steps 33..40 of process 1's replicas: lost.
  # A survivor whose live copy is older than where it was (its devices were stuck) skips the difference.
  stuck = [H(checkpoints=(32,), live=(36,), seen_peer_steps={0: 45, 1: 40}), H(checkpoints=(32,))]
  assert restart_plan.plan('partial', False, stuck).position == [45, 40]
  # Lock-step algorithms (fr_*) go on together, from the furthest position.
  assert restart_plan.plan('partial', True, holdings).position == [45, 45]


def test_holdings_travel_as_json():
  holdings = H(checkpoints=(16, 32), live=(45,), seen_peer_steps={1: 40})
  assert H.from_json(holdings.to_json()) == holdings
