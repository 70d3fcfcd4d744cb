"""GRPO losses against hand-computed values on small tensors: advantages, masking, clipping,
aggregation, KL, and the decoupled (stale-token) importance correction."""

from __future__ import annotations

import math

import pytest
import torch
from agentrl.train.grpo import aggregate, group_advantages, k3_kl, policy_loss

NAN = float("nan")


def test_group_advantages_mean_centred_and_std_scaled() -> None:
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    a = group_advantages(r)
    assert torch.allclose(a, torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]))
    s = group_advantages(r, scale_std=True, eps=0.0)
    std = math.sqrt((4 * 0.25) / 3)  # sample std of 1,0,0,1
    want = torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0] * 4]) / torch.tensor([[std], [1.0]])
    assert torch.allclose(s, want, atol=1e-6)


def test_group_advantages_masked_entries_excluded() -> None:
    r = torch.tensor([[0.5, NAN, 1.0, 0.0], [1.0, NAN, NAN, NAN], [0.2, 0.9, NAN, 0.2]])
    m = ~torch.isnan(r)
    a = group_advantages(r, m)
    assert torch.allclose(
        a,
        torch.tensor([[0.0, 0.0, 0.5, -0.5], [0.0] * 4, [-0.7 / 3, 1.4 / 3, 0.0, -0.7 / 3]]),
        atol=1e-6,
    )
    assert not torch.isnan(a).any()
    # With std scaling the masked entry still does not count: std of [0.5, 1.0, 0.0] = 0.5.
    s = group_advantages(r, m, scale_std=True, eps=0.0)
    assert torch.allclose(s[0], torch.tensor([0.0, 0.0, 1.0, -1.0]), atol=1e-6)


def test_group_advantages_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="groups"):
        group_advantages(torch.zeros(4))
    with pytest.raises(ValueError, match="mask shape"):
        group_advantages(torch.zeros(2, 2), torch.ones(2, 3, dtype=torch.bool))


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -1.0, -1.5]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.tensor([1.0, -2.0])
    return logp, mask, adv


def test_loss_aggregations_by_hand() -> None:
    logp, mask, adv = _batch()
    # Ratio 1 everywhere (prox = logp): per-token loss is -A.
    loss, st = policy_loss(logp, adv, mask, agg="seq_mean")
    assert loss.item() == pytest.approx((-1.0 + 2.0) / 2)
    loss.backward()
    assert logp.grad is not None
    want = torch.tensor([[-1 / 4, -1 / 4, 0.0], [2 / 6, 2 / 6, 2 / 6]])
    assert torch.allclose(logp.grad, want)
    assert st.tokens == 5 and st.clip_fraction == 0.0 and st.mean_ratio == pytest.approx(1.0)

    loss, _ = policy_loss(logp, adv, mask, agg="token_mean")
    assert loss.item() == pytest.approx((-1 * 2 + 2 * 3) / 5)
    loss, _ = policy_loss(logp, adv, mask, agg="dr_grpo", max_new_tokens=4)
    assert loss.item() == pytest.approx((-2 + 6) / (4 * 2))
    with pytest.raises(ValueError, match="max_new_tokens"):
        policy_loss(logp, adv, mask, agg="dr_grpo")
    with pytest.raises(ValueError, match="agg"):
        policy_loss(logp, adv, mask, agg="sum")


def test_masked_sequences_count_nowhere() -> None:
    logp, mask, adv = _batch()
    loss, st = policy_loss(logp, adv, mask, agg="seq_mean", seq_mask=torch.tensor([True, False]))
    assert loss.item() == pytest.approx(-1.0)  # only sequence 0, over 1 sequence
    assert st.tokens == 2
    loss, _ = policy_loss(logp, adv, mask, agg="token_mean", seq_mask=torch.tensor([False, True]))
    assert loss.item() == pytest.approx(2.0)


def test_micro_batches_add_up_with_global_counts() -> None:
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(6, 5, generator=g)
    mask = torch.rand(6, 5, generator=g) > 0.3
    mask[:, 0] = True
    adv = torch.randn(6, generator=g)
    behav = logp + 0.1 * torch.randn(6, 5, generator=g)
    for agg in ("seq_mean", "token_mean", "dr_grpo"):
        full, _ = policy_loss(logp, adv, mask, behav_logp=behav, agg=agg, max_new_tokens=5)
        kw = {"n_seqs": 6.0, "n_tokens": float(mask.sum()), "max_new_tokens": 5}
        parts = [
            policy_loss(logp[s], adv[s], mask[s], behav_logp=behav[s], agg=agg, **kw)[0]
            for s in (slice(0, 2), slice(2, 6))
        ]
        assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), rel=1e-6)


def test_clipping_is_asymmetric_and_stops_gradients() -> None:
    prox = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]]))
    # Ratios 1.5, 1.5, 0.5, 0.5 against the proximal policy.
    logp = (prox + torch.log(torch.tensor([[1.5, 1.5, 0.5, 0.5]]))).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, st = policy_loss(
        logp, adv, mask, prox_logp=prox, eps_low=0.2, eps_high=0.3, agg="token_mean"
    )
    # min(r A, clip(r) A): 1.3 (clipped), -1.5, -0.8 (clipped), 0.5.
    assert loss.item() == pytest.approx(-(1.3 - 1.5 - 0.8 + 0.5) / 4)
    loss.backward()
    assert logp.grad is not None
    # d(-r A / 4)/d logp = -r A / 4 on unclipped tokens, 0 on clipped ones.
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 1.5 / 4, 0.0, -0.5 / 4]]))
    assert st.clip_fraction == pytest.approx(0.5)
    assert st.mean_ratio == pytest.approx(1.0)


def test_importance_weights_from_behaviour_logprobs_are_capped() -> None:
    logp = torch.tensor([[-1.0, -1.0, -1.0]], requires_grad=True)
    behav = torch.tensor([[-1.0 - math.log(2.0), -1.0 - math.log(10.0), -1.0 + math.log(4.0)]])
    adv = torch.tensor([1.0])
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, st = policy_loss(logp, adv, mask, behav_logp=behav, is_cap=5.0, agg="token_mean")
    # Weights pi_prox/pi_behav = 2, 10 -> capped at 5, 1/4.
    assert loss.item() == pytest.approx(-(2 + 5 + 0.25) / 3)
    loss.backward()
    assert logp.grad is not None
    assert torch.allclose(logp.grad, torch.tensor([[-2 / 3, -5 / 3, -0.25 / 3]]))
    assert st.mean_is_weight == pytest.approx((2 + 5 + 0.25) / 3)
    assert st.is_capped_fraction == pytest.approx(1 / 3)
    loss, _ = policy_loss(logp, adv, mask, behav_logp=behav, is_cap=None, agg="token_mean")
    assert loss.item() == pytest.approx(-(2 + 10 + 0.25) / 3)


def test_decoupled_gradient_from_stale_samples_is_unbiased() -> None:
    """Samples from a stale behaviour policy, weighted by pi_prox/pi_behav, give the
    on-policy policy gradient: compare against the exact gradient of E_pi[A]."""
    torch.manual_seed(0)
    logits = torch.tensor([0.3, -0.2, 1.0, 0.0, -1.0], requires_grad=True)
    advantage = torch.tensor([1.0, -0.5, 0.2, 2.0, -1.0])
    behav_logits = torch.tensor([0.0, 0.5, 0.0, -0.5, 0.3])  # a stale policy
    exact_obj = (torch.softmax(logits, 0) * advantage).sum()
    (exact,) = torch.autograd.grad(exact_obj, logits)

    n = 400_000
    behav_lp = torch.log_softmax(behav_logits, 0)
    actions = torch.multinomial(behav_lp.exp(), n, replacement=True)
    logp = torch.log_softmax(logits, 0)[actions].unsqueeze(1)
    loss, _ = policy_loss(
        logp,
        advantage[actions],
        torch.ones(n, 1, dtype=torch.bool),
        behav_logp=behav_lp[actions].unsqueeze(1),
        is_cap=None,
        agg="seq_mean",
    )
    (est,) = torch.autograd.grad(-loss, logits)
    assert torch.allclose(est, exact, atol=0.02), (est, exact)
    # Without the correction the same samples estimate a different (biased) gradient.
    logp = torch.log_softmax(logits, 0)[actions].unsqueeze(1)
    loss_b, _ = policy_loss(logp, advantage[actions], torch.ones(n, 1, dtype=torch.bool))
    (biased,) = torch.autograd.grad(-loss_b, logits)
    assert (biased - exact).abs().max() > 0.1


def test_k3_kl_by_hand_and_in_the_loss() -> None:
    kl = k3_kl(torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -2.0]))
    assert kl[0].item() == pytest.approx(math.exp(-1) + 1 - 1)
    assert kl[1].item() == pytest.approx(0.0)
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-2.0, -2.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, st = policy_loss(
        logp, torch.tensor([0.0]), mask, ref_logp=ref, kl_coef=0.5, agg="token_mean"
    )
    assert loss.item() == pytest.approx(0.5 * math.exp(-1) / 2)
    assert st.kl == pytest.approx(math.exp(-1) / 2)
    loss.backward()
    assert logp.grad is not None
    # d k3 / d logp = 1 - exp(ref - logp)
    assert torch.allclose(logp.grad, torch.tensor([[0.5 * (1 - math.exp(-1)) / 2, 0.0]]))
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(logp, torch.tensor([0.0]), mask, kl_coef=0.1)


def test_aggregate_defaults_ignore_empty_sequences() -> None:
    x = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    m = torch.tensor([[True, True], [False, False]])
    assert aggregate(x, m, "seq_mean").item() == pytest.approx(2.0)
    assert aggregate(x, m, "token_mean").item() == pytest.approx(2.0)
    assert aggregate(x, m, "dr_grpo", max_new_tokens=4).item() == pytest.approx(1.0)
