"""attn_course.fit: a small training loop with a progress bar."""

import math

import pytest
import torch
from torch import nn

import attn_course as ac
from attn_course.training import History, fit, move_to


pytestmark = pytest.mark.usefixtures("one_thread")


def _regression(seed=0, n=64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.3
    return x, y


def _mse(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def test_fit_lowers_the_loss_and_returns_one_loss_per_step(device):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    x, y = _regression()
    history = fit(model, lambda step: (x, y), _mse, steps=150, lr=0.05, device=device, progress=False)
    assert isinstance(history, History) and len(history.losses) == 150
    assert all(isinstance(loss, float) for loss in history.losses)
    assert history.losses[-1] < 0.01 * history.losses[0]
    assert history.mean_loss(10) == pytest.approx(sum(history.losses[-10:]) / 10)
    assert next(model.parameters()).device.type == torch.device(device).type
    assert model.training


def test_fit_is_reproducible_given_the_seed():
    def run():
        ac.set_seed(3)
        model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        g = torch.Generator().manual_seed(1)

        def make_batch(step):
            x = torch.randn(16, 3, generator=g)
            return x, x.sum(-1, keepdim=True)

        return fit(model, make_batch, _mse, steps=20, lr=0.01, progress=False).losses

    assert run() == run()


def test_make_batch_receives_the_step_number():
    seen = []
    x, y = _regression()

    def make_batch(step):
        seen.append(step)
        return x, y

    fit(nn.Linear(3, 1), make_batch, _mse, steps=5, progress=False)
    assert seen == [0, 1, 2, 3, 4]


def test_iterables_are_cycled_and_dataloaders_work():
    x, y = _regression(n=12)
    batches = [(x[:6], y[:6]), (x[6:], y[6:])]
    seen = []

    def loss_fn(model, batch):
        seen.append(batch[0][0, 0].item())
        return _mse(model, batch)

    fit(nn.Linear(3, 1), batches, loss_fn, steps=5, progress=False)
    assert seen == [x[0, 0].item(), x[6, 0].item()] * 2 + [x[0, 0].item()]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    assert len(fit(nn.Linear(3, 1), loader, _mse, steps=7, progress=False).losses) == 7


def test_move_to_handles_nested_batches(device):
    batch = {"x": torch.ones(2), "pair": (torch.zeros(1), [torch.ones(3), "label"]), "n": 3}
    moved = move_to(batch, torch.device(device))
    assert moved["x"].device.type == torch.device(device).type
    assert moved["pair"][1][0].device.type == torch.device(device).type
    assert isinstance(moved["pair"], tuple) and isinstance(moved["pair"][1], list)
    assert moved["pair"][1][1] == "label" and moved["n"] == 3


def test_gradients_are_clipped():
    model = nn.Linear(1, 1, bias=False)
    norms = []

    def loss_fn(model, batch):
        return 1e6 * model(batch).sum()  # gradient 4e6 for a batch of four ones

    original_step = torch.optim.Adam.step

    def spy(self, *args, **kwargs):
        norms.append(float(model.weight.grad.norm()))
        return original_step(self, *args, **kwargs)

    torch.optim.Adam.step = spy
    try:
        fit(model, lambda step: torch.ones(4, 1), loss_fn, steps=2, max_grad_norm=0.5, progress=False)
        fit(model, lambda step: torch.ones(4, 1), loss_fn, steps=1, max_grad_norm=None, progress=False)
    finally:
        torch.optim.Adam.step = original_step
    assert norms[0] == pytest.approx(0.5, rel=1e-4) and norms[1] == pytest.approx(0.5, rel=1e-4)
    assert norms[2] == pytest.approx(4e6, rel=1e-4)


@pytest.mark.parametrize("schedule, expected", [("constant", [0.1] * 4), ("linear", [0.1, 0.075, 0.05, 0.025])])
def test_learning_rate_schedules(schedule, expected):
    rates = []
    original_step = torch.optim.Adam.step

    def spy(self, *args, **kwargs):
        rates.append(self.param_groups[0]["lr"])
        return original_step(self, *args, **kwargs)

    torch.optim.Adam.step = spy
    try:
        x, y = _regression()
        fit(nn.Linear(3, 1), lambda step: (x, y), _mse, steps=4, lr=0.1, schedule=schedule, progress=False)
    finally:
        torch.optim.Adam.step = original_step
    assert rates == pytest.approx(expected)


def test_progress_bar_in_a_terminal(capsys):
    x, y = _regression()
    fit(nn.Linear(3, 1), lambda step: (x, y), _mse, steps=12, progress=True, description="demo run")
    err = capsys.readouterr().err
    assert "demo run" in err and "12/12" in err and "loss=" in err
    fit(nn.Linear(3, 1), lambda step: (x, y), _mse, steps=3, progress=False)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(steps=0), ValueError, "steps.*0"),
    (dict(steps=2.5), TypeError, "steps.*float"),
    (dict(steps=3, lr=-0.1), ValueError, "lr.*-0.1"),
    (dict(steps=3, lr=math.inf), ValueError, "lr.*inf"),
    (dict(steps=3, max_grad_norm=0), ValueError, "max_grad_norm.*0"),
    (dict(steps=3, progress="yes"), TypeError, "progress.*'yes'"),
    (dict(steps=3, schedule="cosine"), ValueError, "schedule.*'cosine'"),
])
def test_bad_settings_name_the_argument(kwargs, error, pattern):
    x, y = _regression()
    with pytest.raises(error, match=pattern):
        fit(nn.Linear(3, 1), lambda step: (x, y), _mse, **kwargs)


def test_bad_model_batches_and_losses():
    x, y = _regression()
    with pytest.raises(TypeError, match="model.*function"):
        fit(lambda x: x, lambda step: (x, y), _mse, steps=2)
    with pytest.raises(TypeError, match="loss_fn.*int"):
        fit(nn.Linear(3, 1), lambda step: (x, y), 3, steps=2)
    with pytest.raises(TypeError, match="batches.*int"):
        fit(nn.Linear(3, 1), 7, _mse, steps=2)
    with pytest.raises(ValueError, match="batches.*empty"):
        fit(nn.Linear(3, 1), [], _mse, steps=2, progress=False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        fit(nn.ReLU(), lambda step: (x, y), _mse, steps=2)
    with pytest.raises(ValueError, match=r"scalar tensor.*\(64, 1\).*step 0"):
        fit(nn.Linear(3, 1), lambda step: (x, y), lambda m, b: m(b[0]), steps=2, progress=False)
    with pytest.raises(ValueError, match="nan at step 0.*lr"):
        fit(nn.Linear(3, 1), lambda step: (x, y), lambda m, b: m(b[0]).sum() * float("nan"), steps=2, progress=False)
    with pytest.raises(ValueError, match="empty"):
        History().mean_loss()
