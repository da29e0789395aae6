"""What to train, as the command line and ``aotc.compile(..., train=...)`` say it: the loss, the
optimizer and the trainable parameters."""

from __future__ import annotations

from dataclasses import dataclass, field

from aotc.errors import AotcError

# Each optimizer's hyper-parameters and their defaults (PyTorch's; weight_decay is an L2 term in the
# gradient, except for AdamW, which decays the weights).
OPTIMIZERS: dict[str, dict[str, float]] = {
    "sgd": {"lr": 0.01, "weight_decay": 0.0},
    "momentum": {"lr": 0.01, "momentum": 0.9, "nesterov": 0.0, "weight_decay": 0.0},
    "adam": {"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0},
    "adamw": {"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01},
}
LOSSES = ("softmax_ce", "mse")


@dataclass(frozen=True)
class Loss:
    """``kind`` "tensor": the graph's own scalar ``tensor`` is the loss. "softmax_ce" (softmax cross-entropy
    of the logits against int64 class indices) and "mse" (mean squared error against a target of the
    prediction's shape) are appended to the prediction ``tensor`` (None: the model's first output);
    ``labels`` names the new input holding the classes or targets."""

    kind: str
    labels: str | None = None
    tensor: str | None = None


@dataclass(frozen=True)
class Optimizer:
    kind: str
    params: dict[str, float] = field(default_factory=dict)

    def __getitem__(self, key: str) -> float:
        return self.params[key]


@dataclass(frozen=True)
class Train:
    """Compile a training step (``aotc.compile(model, train=aotc.Train("softmax_ce:labels", "sgd:lr=0.5"))``).

    ``loss``: ``NAME`` (a float scalar tensor of the graph, e.g. a SoftmaxCrossEntropyLoss output),
    ``softmax_ce:LABELS[:LOGITS]`` or ``mse:TARGETS[:OUTPUT]``. ``optimizer``: ``sgd:lr=..``,
    ``momentum:lr=..,momentum=..[,nesterov=1]``, ``adam:lr=..,beta1=..,beta2=..,eps=..`` or ``adamw:..``,
    each also with ``weight_decay=..``.
    ``trainable``: ``"all"`` (every float initializer the graph computes with, except BatchNorm's
    running statistics) or the initializers' names."""

    loss: str
    optimizer: str = "sgd:lr=0.01"
    trainable: str | tuple[str, ...] = "all"

    def parsed_loss(self) -> Loss:
        return parse_loss(self.loss)

    def parsed_optimizer(self) -> Optimizer:
        return parse_optimizer(self.optimizer)

    def trainable_names(self) -> list[str] | None:
        """The names given, or None for all."""
        if isinstance(self.trainable, str):
            return None if self.trainable == "all" else [n for n in self.trainable.split(",") if n]
        return list(self.trainable)


def parse_loss(text: str) -> Loss:
    kind, sep, rest = text.partition(":")
    if not sep:
        if not text:
            raise AotcError("--loss needs a tensor name, softmax_ce:LABELS or mse:TARGETS")
        return Loss("tensor", tensor=text)
    if kind not in LOSSES:
        raise AotcError(f"unknown loss {kind!r} in {text!r}: expected a tensor name, "
                        + " or ".join(f"{k}:LABELS[:OUTPUT]" for k in LOSSES))
    labels, _, tensor = rest.partition(":")
    if not labels:
        raise AotcError(f"loss {text!r}: name the input that holds the labels ({kind}:LABELS)")
    return Loss(kind, labels, tensor or None)


def parse_optimizer(text: str) -> Optimizer:
    kind, _, rest = text.partition(":")
    if kind not in OPTIMIZERS:
        raise AotcError(f"unknown optimizer {kind!r} in {text!r}: expected one of {', '.join(OPTIMIZERS)}")
    params = dict(OPTIMIZERS[kind])
    for item in (p for p in rest.split(",") if p):
        key, sep, value = item.partition("=")
        if not sep or key not in params:
            raise AotcError(f"optimizer {text!r}: {item!r} is not KEY=VALUE with KEY one of {', '.join(params)}")
        try:
            params[key] = float(value)
        except ValueError:
            raise AotcError(f"optimizer {text!r}: {key} must be a number, got {value!r}") from None
    if not params["lr"] > 0:
        raise AotcError(f"optimizer {text!r}: lr must be positive")
    return Optimizer(kind, params)
