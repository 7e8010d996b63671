"""The learned response-length predictor: an online linear model of log length.

PreServe (§4.2) prompt-tunes DistilBERT on the prompt's text.  A balancer has
neither a GPU nor the budget for it: a decision must cost well under a
millisecond on a CPU, and no weights may be downloaded when it starts.  What it
does have is cheap and, on conversation traffic, telling: the prompt's length,
``max_tokens``, the system prompt's identity, the lengths of the session's
earlier answers, and a few words at each end of the last user message
("translate", "in one word", "write an essay", a trailing code fence).

Model: a baseline, corrected by a linear model of the log ratio to it.  The
baseline is the mean of the session's earlier answers, else the running mean of
every answer observed (the ``session-mean`` predictor, which alone is hard to
beat on conversations); the correction is a linear regression of
``log(1 + actual) - log(1 + baseline)`` over the features, the words and the
system prompt hashed into ``BUCKETS`` buckets, trained online with AdaGrad, one
step per completed request (river's ``LinearRegression``; the step itself is
``adagrad_learn_one``, river's ``learn_one`` without its overhead).  An untrained
correction is 0, so the model starts as the baseline and moves off it only
where the cues say so; the log ratio keeps a few 2,000-token answers from
dominating the fit.  Tuned on the ShareGPT sample's training split (learning
rate, passes, optimiser; docs/benchmarks.md has the numbers): AdaGrad at 0.02
with one bootstrap pass did best, more passes overfit.

Why river: it is built for exactly this, one example at a time (``predict_one``,
``learn_one`` on a sparse dict), is kept up (releases through 2026), pickles its
state, and needs numpy/scipy only, no model weights.  Measured (``manage.py
bench predictor``, docs/benchmarks.md): a few microseconds per prediction,
independent of the prompt's length because the features are (``word_cues`` reads
a fixed number of characters).  scikit-learn's ``SGDRegressor.partial_fit``
would do the same maths, but validates its input arrays on every call, which
costs more per single prediction than the whole river model.

Bootstrapping: ``fit`` runs the same online updates over recorded (features,
length) pairs for a few passes; ``state``/``from_state`` carry a trained model
in bytes (the glue reads and writes the file; this module does no I/O).  Until
it has seen anything, the model's intercept predicts ``DEFAULT_OUTPUT_TOKENS``.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Iterable

from river import linear_model, optim, utils

from core.length_predictor import (
    DEFAULT_OUTPUT_TOKENS,
    RequestFeatures,
    clamp_prediction,
)

# Hash buckets for words and system prompts: enough that the few hundred words
# that carry intent rarely collide, few enough to keep the weights small.
BUCKETS = 1 << 12
_SYSTEM_BASE = BUCKETS  # system prompt buckets follow the word buckets
_SYSTEM_BUCKETS = 1 << 10
# log(1 + tokens) of the longest plausible answer: scales the numeric features to ~[0, 1].
_LOG_SCALE = math.log1p(32_768)

Features = dict[str | int, float]


def encode(features: RequestFeatures) -> Features:
    """The model's input: numeric features scaled to about [0, 1], hashed words and
    system prompt as one-hot buckets, the endpoint as a named indicator."""
    encoded: Features = {
        "log_prompt": math.log1p(features.prompt_tokens) / _LOG_SCALE,
        f"endpoint:{features.endpoint}": 1.0,
    }
    if features.max_tokens:
        encoded["log_max_tokens"] = math.log1p(features.max_tokens) / _LOG_SCALE
    earlier = features.earlier_outputs
    if earlier:
        encoded["log_last_output"] = math.log1p(earlier[-1]) / _LOG_SCALE
        encoded["log_mean_output"] = math.log1p(sum(earlier) / len(earlier)) / _LOG_SCALE
        encoded["turns"] = len(earlier) / 8
    else:
        encoded["first_turn"] = 1.0
    if features.system_key:
        encoded[_SYSTEM_BASE + features.system_key % _SYSTEM_BUCKETS] = 1.0
    for cue in features.cues:
        encoded[cue % BUCKETS] = 1.0
    return encoded


class LearnedPredictor:
    """Online linear regression of log output length (see the module docstring)."""

    name = "learned"

    def __init__(self, *, learning_rate: float = 0.02) -> None:
        self.model = linear_model.LinearRegression(
            optimizer=optim.AdaGrad(learning_rate), intercept_lr=0.01
        )
        self.observed = 0
        self.observed_tokens = 0
        self._learn = _learner(self.model)

    def baseline(self, features: RequestFeatures) -> float:
        """log(1 + the session's mean answer), else of the mean of all answers."""
        earlier = features.earlier_outputs
        if earlier:
            return math.log1p(sum(earlier) / len(earlier))
        if self.observed:
            return math.log1p(self.observed_tokens / self.observed)
        return math.log1p(DEFAULT_OUTPUT_TOKENS)

    def predict(self, features: RequestFeatures) -> float:
        log_length = self.baseline(features) + self.model.predict_one(encode(features))
        return clamp_prediction(math.expm1(min(log_length, _LOG_SCALE)), features.max_tokens)

    def observe(self, features: RequestFeatures, actual_output_tokens: int) -> None:
        actual = max(0, actual_output_tokens)
        ratio = math.log1p(actual) - self.baseline(features)
        self._learn(self.model, encode(features), ratio)
        self.observed += 1
        self.observed_tokens += actual

    def fit(self, examples: Iterable[tuple[RequestFeatures, int]], *, passes: int = 1) -> None:
        """Offline bootstrap: ``passes`` online passes over recorded examples."""
        recorded = list(examples)
        for _ in range(passes):
            for features, actual in recorded:
                self.observe(features, actual)

    def state(self) -> bytes:
        """The trained model, to save and load with ``from_state``."""
        return pickle.dumps((self.model, self.observed, self.observed_tokens))

    @classmethod
    def from_state(cls, blob: bytes) -> LearnedPredictor:
        """A predictor from ``state``'s bytes (an operator's own file: pickle is
        trusted here as any code the operator installs)."""
        try:
            model, observed, tokens = pickle.loads(blob)
        except (pickle.UnpicklingError, ValueError, TypeError, EOFError) as exc:
            raise ValueError(f"not a saved length predictor: {exc}") from None
        if not isinstance(model, linear_model.LinearRegression):
            raise ValueError("not a saved length predictor")
        predictor = cls()
        predictor.model, predictor.observed = model, int(observed)
        predictor.observed_tokens = int(tokens)
        predictor._learn = _learner(model)
        return predictor


Learner = Callable[[linear_model.LinearRegression, Features, float], None]


def _learner(model: linear_model.LinearRegression) -> Learner:
    """``adagrad_learn_one`` where it reproduces the model's own ``learn_one`` (the
    configuration this module builds), else river's ``learn_one``."""
    exact = (
        type(model.optimizer) is optim.AdaGrad
        and isinstance(model.optimizer.lr, optim.schedulers.Constant)
        and type(model.loss) is optim.losses.Squared
        and type(model.initializer) is optim.initializers.Zeros
        and model.l1 == 0
        and model.l2 == 0
    )
    return adagrad_learn_one if exact else _river_learn_one


def _river_learn_one(model: linear_model.LinearRegression, x: Features, y: float) -> None:
    model.learn_one(x, y)


def adagrad_learn_one(model: linear_model.LinearRegression, x: Features, y: float) -> None:
    """river 0.26's ``LinearRegression.learn_one`` with AdaGrad, a squared loss, zero
    initial weights and no penalty: the same float operations, in the same order, on
    the same objects, so the weights, the optimiser's state and the saved bytes are
    bit for bit those of ``learn_one`` (a test compares them over thousands of steps).

    Why: ``learn_one`` cost 13.5 µs per completed request, a third of it overhead
    around the maths: the optimiser reads its learning-rate property (a scheduler
    call) once per feature, tries a vector step that AdaGrad does not implement
    (an exception per call) and wraps the weights in a masked view to learn.  Here
    the learning rate is read once (it is constant within a step: the iteration
    count moves after it), and the weights are written directly, a missing one
    read as the zero the initializer would give."""
    optimizer = model.optimizer
    weights = model._weights
    loss_gradient = model.loss.gradient(y_true=y, y_pred=weights.dot(x) + model.intercept)
    loss_gradient = float(
        utils.math.clamp(loss_gradient, -model.clip_gradient, model.clip_gradient)
    )
    model.intercept -= model.intercept_lr.get(optimizer.n_iterations) * loss_gradient
    learning_rate = optimizer.learning_rate
    squares, eps, weight = optimizer.g2, optimizer.eps, weights.get
    for name, gradient in utils.VectorDict.from_scaled(x, loss_gradient).items():
        squares[name] += gradient**2
        weights[name] = weight(name, 0.0) - learning_rate / (squares[name] + eps) ** 0.5 * gradient
    optimizer.n_iterations += 1
