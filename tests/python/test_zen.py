"""Sparse gradients through Zen (docs/zen.md) from cortado.torch."""

from test_bindings import assert_all_ok


def test_distributed_optimizer_sends_sparse_gradients_through_zen(run_job):
    # 2 workers, 2 servers: nn.Embedding(sparse=True) and EmbeddingBag
    # gradients summed through the servers' hash bitmaps, against a plain sum.
    job = run_job(2, 2, "zen_check.py", timeout=240)
    assert_all_ok(job, 2)


def test_distributed_optimizer_sends_sparse_dense_gradients_through_zen(run_job):
    # 2 workers, 2 servers: an nn.Embedding without sparse=True (about 0.2%
    # of its gradient non-zero) goes through Zen from the second step, a
    # dense Linear and a small embedding stay dense; updates against a plain sum.
    job = run_job(2, 2, "zen_dense_check.py", timeout=240)
    assert_all_ok(job, 2)
