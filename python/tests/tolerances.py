"""The golden test's tolerances (tests/suite/models/golden.rs), for comparing one
training step of this package with captune's or with float64 PyTorch."""

import torch


def assert_close(what, got, want, rel, abs_):
    got, want = got.detach().double().flatten(), want.detach().double().flatten()
    assert got.shape == want.shape, f"{what}: {got.shape} against {want.shape}"
    bad = (got - want).abs() > rel * want.abs() + abs_
    if bad.any():
        i = int(bad.nonzero()[0])
        raise AssertionError(f"{what}[{i}]: {float(got[i])} against {float(want[i])}")


def assert_step_close(what, grads, after, want_grads, want_after, norm, lr, eps, max_norm):
    """Gradients within 1e-5 relative and 1e-6 absolute; weights after
    AdamW's first step within 1e-5 relative and 1e-6 absolute, plus lr
    times how much Adam's g / (|g| + eps) magnifies the gradients' f32
    rounding where |g| is near eps (the keys' biases, whose exact
    gradient is zero)."""
    clip = min(max_norm / norm, 1.0)
    for name, g in grads.items():
        assert_close(f"{what}: gradient of {name}", g, want_grads[name], 1e-5, 1e-6)
    for name, value in after.items():
        g = want_grads[name].double().abs() * clip
        g_error = (1e-5 * g + 1e-6 * clip)
        sensitivity = (eps * g_error / (g + eps) ** 2).clamp(max=1.0)
        tol = 1e-5 * want_after[name].double().abs() + 1e-6 + lr * sensitivity
        err = (value.detach().double() - want_after[name].double()).abs()
        if (err > tol).any():
            i = int((err > tol).flatten().nonzero()[0])
            raise AssertionError(f"{what}: {name}[{i}] after AdamW is {float(value.flatten()[i])}, "
                                 f"want {float(want_after[name].flatten()[i])}")
