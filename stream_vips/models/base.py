"""The model protocol every family implements.

The engine owns sampling, the budget check, the ledger, noise and normalisation; a model owns
record preprocessing (which bounds its sensitivity), the E-step behind the privacy wall
(``clipped_sum``) and the M-step on privatized statistics (``update``). Anything a model
computes from raw records stays inside ``clipped_sum``; ``update`` only sees noisy means, so
everything after it is post-processing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from stream_vips.models.auditing import FamilyAudit
    from stream_vips.models.fit_rule import Settings
    from stream_vips.models.synthetic import Demo, SyntheticData


@dataclass(frozen=True)
class Block:
    """One released statistic.

    ``bound`` is C_k: the L2 norm bound on one record's contribution to the block's batch sum
    (after the model's clipping). ``symmetric`` blocks are d x d symmetric matrices whose noise is
    drawn with Analyze-Gauss (upper triangle, mirrored).
    """

    name: str
    shape: tuple[int, ...]
    bound: float
    symmetric: bool = False


@dataclass
class ParsedBatch:
    """Result of validating and preprocessing a list of decoded records.

    ``rows`` holds one array per reservoir column for the accepted records, in order;
    ``accepted`` gives their indices in the input list; ``rejected`` lists
    ``(index, reason_code, detail)`` for the others.
    """

    rows: dict[str, np.ndarray]
    accepted: np.ndarray
    rejected: list[tuple[int, str, str]] = field(default_factory=list)


class Model(ABC):
    """A streaming Bayesian model with a private update.

    Besides the protocol (records, blocks, ``clipped_sum``, ``update``, state), a family states
    here everything the rest of the package needs to know about it, so that a family is its
    module (:mod:`stream_vips.models.registry`): the hooks below, each with a default except
    ``record_format`` and :meth:`audit`, which every family states.
    """

    family: ClassVar[str]
    #: One line: the JSON record the family reads (docs/families.md), d being its dimension.
    record_format: ClassVar[str]
    #: The record field holding the family's vector, and the constructor parameter giving its
    #: public length d (``fit`` and ``learn_many`` put array columns there).
    record_field: ClassVar[str] = "x"
    dim_param: ClassVar[str] = "dim"
    #: ``None`` when ``dim_param`` takes d itself; else the function from that parameter's value
    #: to d (lda: the vocabulary's size), and ``fit`` needs the parameter (d alone does not make it).
    dimension_of: ClassVar[Callable[[Any], int] | None] = None
    #: Parameters a bare configuration of the family needs that its constructor does not default,
    #: merged under the configured ones so that the default configuration runs (linreg: ``dim``).
    default_params: ClassVar[Mapping[str, Any]] = {}
    #: The family's synthetic data (:mod:`stream_vips.models.synthetic`): records drawn from a known
    #: model, for the demo, tests and benchmarks (``None``: the family has none).
    synthetic: ClassVar[type[SyntheticData] | None] = None
    #: What ``stream-vips demo`` streams of that data and how it scores the model (``None``: no demo).
    demo: ClassVar[Demo | None] = None
    #: The constructor parameter holding the family's public randomness (initial values, Monte
    #: Carlo or resampling draws: no record enters them). When it resolves to ``None`` in a seeded
    #: run (``privacy.seed``), :func:`stream_vips.core.build.model_params` derives it from the run's
    #: seed, so that a seeded run is reproducible; unseeded, ``None`` stays OS entropy. A family
    #: must not publish a derived seed in :meth:`hyperparameters` (it is a function of the noise
    #: seed). Ignored when the constructor has no such parameter.
    seed_param: ClassVar[str | None] = "seed"
    #: Why the family does not release through the engine, so that ``fit`` and a stream refuse it
    #: (``None``: it does, and :meth:`fit_rule` states fit's settings; ops releases a sample of its own).
    engine_refusal: ClassVar[str | None] = None
    #: Per rejection reason, what a user whose records are rejected for it most likely got wrong
    #: (``fit`` adds it to its warning about rejected records).
    rejection_hints: ClassVar[Mapping[str, str]] = {}
    #: Constructor parameters the family no longer takes, each with what to set instead: a
    #: configuration naming one is refused with one line (``model.params.<name>: ...``).
    retired_params: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def fit_rule(cls, n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
        """``fit``'s settings for N = ``n`` records of public dimension ``d`` at budget (``epsilon``,
        ``delta``) (``epsilon`` is ``None`` when ``non_private``), from these public quantities
        only, never from a record: the Poisson rate q, the steps, the step-size schedule, the
        noise allocation and the family's parameters (its bounds among them), with one reason per
        choice in ``why``, which the rule's docstring explains. The default refuses fit."""
        from stream_vips.errors import FitError

        raise FitError(f"fit refuses the {cls.family} family: {cls.engine_refusal or 'it states no settings rule'}")

    @classmethod
    def fit_with(cls, settings: Settings, params: Mapping[str, Any], steps: int | None) -> Settings:
        """The rule's ``settings`` once the caller's own model ``params`` and step count ``steps``
        (``None``: the rule's) are known, for a family whose parameters change what its rule
        chooses (logistic's ``release``); the default keeps them."""
        return settings

    @classmethod
    def fit_complete(cls, settings: Settings, params: Mapping[str, Any]) -> Settings:
        """The settings a fit runs with (the rule's or the caller's, with the final step count),
        completed and checked against the caller's own model ``params`` before anything is
        spent: a ValueError names a parameter that cannot work with them. The default keeps them."""
        return settings

    @abstractmethod
    def row_layout(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """Reservoir columns: name -> (dtype, per-record shape)."""

    @abstractmethod
    def parse_batch(self, objs: Sequence[Any]) -> ParsedBatch:
        """Validate and preprocess decoded JSON values into reservoir rows."""

    @abstractmethod
    def blocks(self) -> tuple[Block, ...]:
        """The statistics one step releases, with their per-record bounds."""

    def default_block_weights(self) -> dict[str, float] | None:
        """The noise allocation a_k the engine uses when configuration gives none (``None``:
        a_k proportional to the block bounds, i.e. noise z on the concatenated vector). A family
        whose accuracy is served better by another split says so here, derived from public
        quantities only."""
        return None

    def diameter(self, weights: Mapping[str, float] | None = None) -> float:
        """Replace-one sensitivity of the joint release in units of its joint bound, for the
        engine's noise allocation ``weights`` (a_k per block, sum a_k^2 = 1; ``None``: unknown).

        Two records with contributions u, v of norm <= C move the sum by ||u - v|| <= 2C.
        A model that proves less (e.g. non-negative contributions: sqrt(2) C) overrides this.
        """
        return 2.0

    @abstractmethod
    def clipped_sum(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Sum over the batch of per-record clipped contributions, per block (behind the wall)."""

    @abstractmethod
    def update(self, noisy_mean: Mapping[str, np.ndarray], rho: float) -> None:
        """M-step from privatized mean statistics with Robbins-Monro step ``rho``."""

    @classmethod
    def state_shapes(cls, hyperparameters: Mapping[str, Any]) -> dict[str, tuple[int | None, ...]]:
        """The shapes :meth:`state` has for ``hyperparameters`` (``None``: a length that varies),
        worked out without building the model: a reader compares them with a message's arrays
        before it allocates what the hyperparameters ask for (every registered family has it)."""
        raise NotImplementedError(f"{cls.__name__} does not state its shapes")

    @abstractmethod
    def state(self) -> dict[str, np.ndarray]:
        """Natural parameters to publish."""

    @abstractmethod
    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore natural parameters published by :meth:`state`."""

    @abstractmethod
    def hyperparameters(self) -> dict[str, Any]:
        """Public configuration that shapes the model (JSON-serializable)."""

    def check_noise_multiplier(self, noise_multiplier: float) -> None:  # noqa: B027 (optional hook)
        """Refuse a noise multiplier that the model's own privacy analysis does not allow.

        The engine calls this once before any step; the default accepts every z > 0.
        """

    def own_noise_multiplier(self, epsilon: float, delta: float, batch: float, steps: int) -> float | None:
        """The noise multiplier z the family's own analysis sets for the budget (``epsilon``,
        ``delta``), the expected batch ``batch`` and ``steps`` planned steps, all public
        configuration; ``None`` (the default): the accountant calibrates z to the budget. The
        learner's build calls it once, before the engine, unless the configuration gives z; the
        accountant still accounts every step, and the start warns with the epsilon it certifies
        for the planned steps (sgld's ``noise: paper``)."""
        return None

    def set_noise_scale(self, mean_stds: Mapping[str, float]) -> None:  # noqa: B027 (optional hook)
        """Learn the public noise std on each entry of every released block mean.

        The engine calls this once, from configuration only (z, the bounds, the allocation and
        the normaliser), so a model can set post-processing such as an eigenvalue floor from
        the noise level. The default ignores it.
        """

    @classmethod
    def audit(cls) -> FamilyAudit | str:
        """The family's empirical privacy audit (:mod:`stream_vips.audit`): candidate records built
        from its own bounds, the least ratio its worst pair reaches to the claimed sensitivity and
        why it stops there; or, as a string, why the family has none. There is no default: a
        family arrives with its audit."""
        raise NotImplementedError(f"the {cls.family} family states no audit")

    def summary(self) -> dict[str, Any]:
        """The posterior summary a model message carries (``summary``, docs/model-topic.md) and
        ``stream-vips report`` shows: computed from the state alone, so from released values only
        (post-processing, no privacy cost). ``kind`` (``"coefficients"``: ``mean``, ``sd`` and the
        rule's matrix; ``"mixture"``; ``"topics"``: ``top_words`` and the topic-word means;
        ``"network"``), ``predictive``: the predictive rule in one line naming the keys and constants
        it uses (or why prediction needs the full natural parameters), and ``notes``. The default
        ``{}`` says nothing; every registered family states its own (tests/test_summary.py asks)."""
        return {}

    @classmethod
    def regime_warning(cls, n: int, d: int, epsilon: float) -> str | None:
        """Why a private fit of ``n`` records of dimension ``d`` at ``epsilon`` is known to learn
        little, as one line citing the family's benchmark, or ``None``. Public quantities only
        (N, d and epsilon are public, privacy rule 1), so saying it costs nothing. A family returns
        a reason only for regimes its benchmark measured (the docstring names the JSON file and
        row and the threshold drawn from it); where no benchmark measured the regime it says
        nothing, and the default says nothing."""
        return None

    def prior_location(self) -> tuple[np.ndarray, np.ndarray] | str:
        """The public prior's mean and standard deviation per coefficient of :meth:`summary`
        (``mean`` of a ``coefficients`` summary, or each row of a mixture's ``means``), for
        :meth:`movement`; or, as a string, why the family has none. The default reads the
        hyperparameters ``prior_mean`` (0 when absent) with ``prior_var`` or
        ``prior_precision`` (a Gaussian prior N(m0, s^2 I)); a family whose prior is shaped
        otherwise states its own."""
        h = self.hyperparameters()
        if "prior_var" in h:
            sd = np.sqrt(float(h["prior_var"]))
        elif "prior_precision" in h:
            sd = 1.0 / np.sqrt(float(h["prior_precision"]))
        else:
            return f"the {self.family} family states no Gaussian prior over what its summary reports"
        return np.asarray(h.get("prior_mean", 0.0), dtype=float), np.asarray(sd)

    def movement(self) -> dict[str, Any]:
        """How far the released model moved from its public prior: the posterior mean's distance
        from the prior mean in prior standard deviations (:func:`summaries.movement`), or why that
        cannot be said. Computed from the state and the public prior alone: post-processing, no
        budget (never from the data)."""
        from stream_vips.models import summaries

        return summaries.movement(self.summary(), self.prior_location())

    def joint_bound(self) -> float:
        """L2 bound on one record's contribution to all blocks together."""
        return float(np.sqrt(sum(b.bound**2 for b in self.blocks())))

    # -- privacy.unit: key (privacy rule 12 in docs/privacy.md) -----------------------------

    #: True when :meth:`group_clipped_sum` is implemented; other families refuse ``privacy.unit: key``.
    supports_key_unit: ClassVar[bool] = False
    #: Why a family refuses ``privacy.unit: key`` (its contributions are not additive per record).
    key_unit_note: ClassVar[str] = ("its per-record contributions are not summed per key before clipping "
                                    "(no group_clipped_sum)")

    def group_clipped_sum(self, batch: Mapping[str, np.ndarray], groups: np.ndarray,
                          n_groups: int) -> dict[str, np.ndarray]:
        """Sum over ``n_groups`` privacy units of their clipped contributions (behind the wall).

        ``groups[i]`` is the unit of row i. A unit's contribution is the sum of its records'
        per-record contributions (each clipped as in :meth:`clipped_sum`), scaled by one factor
        ``min(1, min_k C_k / ||sum_k||)`` so that every block of it has norm <= C_k: a unit then
        moves the batch sum no more than one record does under record-level adjacency, whatever
        it sends, and one factor per unit keeps the ratios between its blocks.
        """
        raise NotImplementedError(f"the {self.family} family does not support privacy.unit: key: {self.key_unit_note}")

    def group_diameter(self, weights: Mapping[str, float] | None = None) -> float:
        """Sensitivity of the group sums when all records of one unit are replaced, in units of
        the joint bound: two unit contributions u, u' with every block within C_k differ by at
        most 2C (triangle inequality). A family that proves less for its group sums overrides it."""
        return 2.0


def group_sum(values: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """``out[g] = sum of values[i] over i with groups[i] == g`` (shape ``(n_groups, *values.shape[1:])``)."""
    v = np.asarray(values, dtype=np.float64)
    out = np.zeros((int(n_groups), *v.shape[1:]))
    np.add.at(out, np.asarray(groups, dtype=np.intp), v)
    return out


def group_gram_norms(rows: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Frobenius norm of each group's ``sum_i w_i w_i^T`` over rows w_i (shape ``(n_groups,)``).

    Rows are laid out per group into a zero-padded ``(n_groups, m, d)`` array (m = the largest
    group; padding rows add nothing), and ``||W_g^T W_g||_F = ||W_g W_g^T||_F`` is computed on the
    smaller of the two Gram matrices, so no d x d matrix per record is ever formed.
    """
    W = np.asarray(rows, dtype=np.float64)
    g = np.asarray(groups, dtype=np.intp)
    G = int(n_groups)
    if W.shape[0] == 0:
        return np.zeros(G)
    counts = np.bincount(g, minlength=G)
    order = np.argsort(g, kind="stable")
    starts = np.cumsum(counts) - counts
    rank = np.arange(g.size) - starts[g[order]]
    padded = np.zeros((G, int(counts.max()), W.shape[1]))
    padded[g[order], rank] = W[order]
    if padded.shape[1] <= padded.shape[2]:
        gram = padded @ padded.transpose(0, 2, 1)
    else:
        gram = padded.transpose(0, 2, 1) @ padded
    return np.sqrt(np.einsum("gij,gij->g", gram, gram))


def group_clip_factors(norms_and_bounds: Sequence[tuple[np.ndarray, float]]) -> np.ndarray:
    """One factor per group, ``min(1, min_k bound_k / norm_k)``: after scaling, every block of the
    group has norm <= its bound (a zero norm needs no scaling)."""
    factor = None
    for norms, bound in norms_and_bounds:
        n = np.asarray(norms, dtype=np.float64)
        f = np.minimum(1.0, np.divide(float(bound), n, out=np.ones_like(n), where=n > float(bound)))
        factor = f if factor is None else np.minimum(factor, f)
    if factor is None:
        raise ValueError("group_clip_factors needs at least one block")
    return factor
