"""Shared pieces of the test suites (not collected: no module here is named ``test_*``).

One definition of each helper, by job:

- :mod:`.harness`: run a test body on N gloo ranks in persistent per-rank worker processes (the benchmarks use
  its one-off form, :func:`.harness.run_once`); :mod:`.worker_preload`: what its fork server imports once;
- :mod:`.seeds`: seeds equal in every process, seeded tensors, a rank's rows of a global batch;
- :mod:`.checks`: collect failures as strings on a rank, compare tensors, fingerprint results;
- :mod:`.collectives`: record the collectives a block of code issues;
- :mod:`.references`: the loss formulas written from the papers, the oracle of the loss tests;
- :mod:`.loss_cases`: the replicated model, data and criterion of each loss kind, and its single-process step;
- :mod:`.metrics`: test-only ``Metric`` subclasses that drive the lifecycle and the sync engine;
- :mod:`.outcomes`: run a call and describe what it raised; snapshots of a metric's states;
- :mod:`.property`: budgets, seeded layouts and batch dispatch of the property-based suite;
- :mod:`.states`: random sets of metric states for the sync-engine properties;
- :mod:`.compiled`: compiled training steps and the counters the compile suite checks;
- :mod:`.lightning_runs`: data, towers and reference of the Lightning and Fabric runs.
"""
