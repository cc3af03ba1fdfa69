"""Bella (Doan et al.): P low-rank particle adapters on a frozen trained network.

Every adapted weight matrix W of the base network becomes, for particle p,

    W_p = W + A_p B_p,        A_p [d_in, r], B_p [r, d_out], rank r,

with W (and the bias) frozen. B starts at zero, so every particle starts exactly at the base
network; A is random, so the particles' gradients differ from the first step. A convolution's
kernel [kh, kw, c_in, c_out] is adapted as the matrix [kh*kw*c_in, c_out]; the LSTM's kernel
and recurrent kernel each get their own adapter. The prior on every adapter element is
N(0, prior_stddev^2).

Particles are ensemble members: the batch layout is the rank-1 layers' (row block p of the
tiled batch belongs to particle p), so the models, evaluation (S x K with S = 1: a particle is
deterministic), export and service treat P particles as K = P members without knowing it.
The per-particle weights W_p are materialised once per call ([P, d_in, d_out]) and applied
block-wise: the same FLOPs as the base per row, no per-row weights.

Training (``ParticleUpdate``): the loss of particle p is its mean minibatch NLL plus
-log prior / N_train. "ensemble" follows each particle's own gradient; "svgd" replaces the
gradients by the SVGD direction (``model.layers.svgd``) over the flattened adapters of each
particle, with grad log p(x_p | D) = -N_train * grad loss_p.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any, Sequence

import tensorflow as tf

from model.layers import svgd
from model.layers.posterior import PARTICLE_UPDATES, PosteriorConfig

# Written into a Bella run folder at its start: which base run it adapts (checked on resume).
BASE_FILE = "bella_base.json"


def _adapter_weights(layer: tf.keras.layers.Layer, name: str, particles: int, fan_in: int, fan_out: int,
                     rank: int) -> tuple[tf.Variable, tf.Variable]:
    # A ~ N(0, 1/fan_in): A_p^T x has the scale of x; B = 0: W_p = W at initialisation.
    a = layer.add_weight(f"{name}adapter_a", shape=[particles, fan_in, rank], trainable=True,
                         initializer=tf.keras.initializers.RandomNormal(stddev=1.0 / fan_in ** 0.5))
    b = layer.add_weight(f"{name}adapter_b", shape=[particles, rank, fan_out], trainable=True,
                         initializer="zeros")
    return a, b


def particle_matmul(x: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
    """x [P*n, d] @ weights [P, d, o] block-wise: row block p uses weights[p] -> [P*n, o]."""
    p, d = weights.shape[0], weights.shape[1]
    blocks = tf.reshape(x, [p, -1, d])
    return tf.reshape(tf.matmul(blocks, weights), [-1, weights.shape[-1]])


class _Particles:
    """Mixin of every Bella layer: particle count, rank, prior scale, its adapters."""

    def _set_particles(self, config: PosteriorConfig) -> None:
        self.particles = config.ensemble_size
        self.rank = config.adapter_rank
        self.prior_stddev = config.prior_stddev

    @property
    def ensemble_size(self) -> int:
        """K = P: a particle is an ensemble member."""
        return self.particles

    def adapter_variables(self) -> list[tf.Variable]:
        """The trainable adapters of this layer (its only trainable weights), particle axis first."""
        return list(self.trainable_weights)


class _Adapted(_Particles, tf.keras.layers.Layer):
    """A Bella layer with one adapted matrix."""

    def __init__(self, config: PosteriorConfig, **kwargs):
        super().__init__(**kwargs)
        self._set_particles(config)


class BellaDense(_Adapted):
    """A dense layer y = x (W + A_p B_p) + b for row block p; W and b frozen."""

    def __init__(self, units: int, config: PosteriorConfig, *, activation=None, use_bias: bool = True, **kwargs):
        super().__init__(config, **kwargs)
        self.units = units
        self.activation = tf.keras.activations.get(activation)
        self.use_bias = use_bias

    def build(self, input_shape):
        d = int(input_shape[-1])
        self.kernel = self.add_weight("kernel", shape=[d, self.units], trainable=False,
                                      initializer="glorot_uniform")
        self.bias = self.add_weight("bias", shape=[self.units], trainable=False, initializer="zeros") \
            if self.use_bias else None
        self.adapter_a, self.adapter_b = _adapter_weights(self, "", self.particles, d, self.units, self.rank)
        super().build(input_shape)

    def particle_kernels(self) -> tf.Tensor:
        """W + A_p B_p for every particle: [P, d_in, units]."""
        return self.kernel[None] + tf.matmul(self.adapter_a, self.adapter_b)

    def call(self, inputs):
        y = particle_matmul(inputs, self.particle_kernels())
        if self.use_bias:
            y = tf.nn.bias_add(y, self.bias)
        return self.activation(y) if self.activation is not None else y


class BellaConv2D(_Adapted):
    """A 2-D convolution whose kernel for row block p is W + reshape(A_p B_p); W and b frozen."""

    def __init__(self, filters: int, kernel_size, config: PosteriorConfig, *, strides=(1, 1),
                 padding: str = "valid", activation=None, use_bias: bool = True, **kwargs):
        super().__init__(config, **kwargs)
        self.filters = filters
        self.kernel_size = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
        self.strides = (strides, strides) if isinstance(strides, int) else tuple(strides)
        self.padding = padding.upper()
        self.activation = tf.keras.activations.get(activation)
        self.use_bias = use_bias

    def build(self, input_shape):
        c_in = int(input_shape[-1])
        shape = [*self.kernel_size, c_in, self.filters]
        self.kernel = self.add_weight("kernel", shape=shape, trainable=False, initializer="glorot_uniform")
        self.bias = self.add_weight("bias", shape=[self.filters], trainable=False, initializer="zeros") \
            if self.use_bias else None
        fan_in = self.kernel_size[0] * self.kernel_size[1] * c_in
        self.adapter_a, self.adapter_b = _adapter_weights(self, "", self.particles, fan_in, self.filters,
                                                          self.rank)
        super().build(input_shape)

    def particle_kernels(self) -> tf.Tensor:
        """W + reshape(A_p B_p) for every particle: [P, kh, kw, c_in, filters]."""
        delta = tf.reshape(tf.matmul(self.adapter_a, self.adapter_b), [self.particles, *self.kernel.shape])
        return self.kernel[None] + delta

    def call(self, inputs):
        kernels = self.particle_kernels()
        blocks = tf.split(inputs, self.particles, axis=0)
        y = tf.concat([tf.nn.conv2d(x, kernels[p], strides=self.strides, padding=self.padding)
                       for p, x in enumerate(blocks)], axis=0)
        if self.use_bias:
            y = tf.nn.bias_add(y, self.bias)
        return self.activation(y) if self.activation is not None else y


class BellaLSTMCell(_Particles, tf.keras.layers.LSTMCell):
    """An LSTM cell with frozen kernel / recurrent kernel / bias and an adapter on each matrix.

    ``model.layers.rank1_lstm.Rank1LSTM`` reads ``particle_kernels()`` and applies them block-wise;
    ``call`` does the same for one step (so the cell also runs in ``tf.keras.layers.RNN``).
    """

    def __init__(self, units: int, config: PosteriorConfig, **kwargs):
        super().__init__(units, **kwargs)
        self._set_particles(config)

    def build(self, input_shape):
        d, u = int(input_shape[-1]), self.units
        # Same names and shapes as keras' LSTMCell, so a deterministic base's weights map one to one.
        self.kernel = self.add_weight("kernel", shape=[d, 4 * u], trainable=False, initializer="glorot_uniform")
        self.recurrent_kernel = self.add_weight("recurrent_kernel", shape=[u, 4 * u], trainable=False,
                                                initializer="orthogonal")
        self.bias = self.add_weight("bias", shape=[4 * u], trainable=False, initializer="zeros") \
            if self.use_bias else None
        self.adapter_a, self.adapter_b = _adapter_weights(self, "", self.particles, d, 4 * u, self.rank)
        self.recurrent_adapter_a, self.recurrent_adapter_b = _adapter_weights(
            self, "recurrent_", self.particles, u, 4 * u, self.rank)
        self.built = True

    def particle_kernels(self) -> tuple[tf.Tensor, tf.Tensor]:
        """(W + A_p B_p [P, d, 4u], U + A'_p B'_p [P, u, 4u])."""
        return (self.kernel[None] + tf.matmul(self.adapter_a, self.adapter_b),
                self.recurrent_kernel[None] + tf.matmul(self.recurrent_adapter_a, self.recurrent_adapter_b))

    def call(self, inputs, states, training=None):
        h, c = states[0], states[1]
        kernel, recurrent = self.particle_kernels()
        z = particle_matmul(inputs, kernel) + particle_matmul(h, recurrent)
        if self.use_bias:
            z = z + self.bias
        z_i, z_f, z_c, z_o = tf.split(z, 4, axis=-1)
        c_new = self.recurrent_activation(z_f) * c + self.recurrent_activation(z_i) * self.activation(z_c)
        h_new = self.recurrent_activation(z_o) * self.activation(c_new)
        return h_new, [h_new, c_new]


# --- the factory's entry (registered in model.layers.factory) --------------------------------------

def dense(units, config, *, activation, use_bias, name):
    """Factory builder: BellaDense."""
    return BellaDense(units, config, activation=activation, use_bias=use_bias, name=name)


def conv2d(filters, kernel_size, config, *, strides, padding, activation, use_bias, name):
    """Factory builder: BellaConv2D."""
    return BellaConv2D(filters, kernel_size, config, strides=strides, padding=padding, activation=activation,
                       use_bias=use_bias, name=name)


def lstm_cell(units, config, *, name):
    """Factory builder: BellaLSTMCell."""
    return BellaLSTMCell(units, config, name=name)


# --- the model as a set of particles ------------------------------------------------------

def adapted_layers(model: tf.Module) -> list[Any]:
    """Every Bella layer under `model`, in a stable order."""
    return [m for m in model.submodules if isinstance(m, _Particles)]


def adapter_variables(model: tf.Module) -> list[tf.Variable]:
    """All adapters of the model (each [P, ...]): the only trainable variables of a Bella run."""
    return [v for layer in adapted_layers(model) for v in layer.adapter_variables()]


def freeze_base(model: tf.keras.Model) -> None:
    """Makes every non-adapter variable non-trainable (embeddings, projections, batch norms, ...).

    A frozen Keras BatchNormalization also runs in inference mode (moving statistics), so the
    base's normalisation stays the base's.
    """
    for module in model.submodules:
        if not isinstance(module, tf.keras.layers.Layer) or isinstance(module, _Particles):
            continue
        own = [m for m in module.submodules if isinstance(m, tf.keras.layers.Layer)]
        if not own:  # a leaf layer: its variables are all base weights
            module.trainable = False


def copy_base_weights(base: tf.keras.Model, model: tf.keras.Model) -> int:
    """Copies every variable of the trained base into the Bella model (matched by name); returns the count.

    Raises ValueError naming the variable when a base weight has no counterpart of the same
    shape, or a non-adapter weight of the Bella model is not in the base.
    """
    adapters = {v.ref() for v in adapter_variables(model)}
    targets = {v.name: v for v in model.variables if v.ref() not in adapters}
    sources = {v.name: v for v in base.variables}
    missing = sorted(set(targets) - set(sources))
    extra = sorted(set(sources) - set(targets))
    if missing or extra:
        raise ValueError(f"base and Bella model differ: not in base {missing[:5]}, not in Bella model {extra[:5]} "
                         "(the base must be a deterministic run of the same architecture)")
    for name, target in targets.items():
        source = sources[name]
        if source.shape != target.shape:
            raise ValueError(f"base weight {name}: shape {source.shape} vs {target.shape} in the Bella model")
        target.assign(source)
    return len(targets)


def checkpoint_sha256(checkpoint_prefix: str) -> str:
    """SHA-256 over a TensorFlow checkpoint's files (index and data shards, in name order)."""
    digest = hashlib.sha256()
    for path in sorted(tf.io.gfile.glob(checkpoint_prefix + ".*")):
        digest.update(os.path.basename(path).encode())
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def base_record(base_dir: str | os.PathLike[str], checkpoint_prefix: str, step: int) -> dict[str, Any]:
    """What a Bella run records about its base: folder name, checkpoint, step and checksum."""
    return {"run": pathlib.Path(base_dir).name, "checkpoint": os.path.basename(checkpoint_prefix), "step": int(step),
            "checkpoint_sha256": checkpoint_sha256(checkpoint_prefix)}


def record_base(out: pathlib.Path, record: dict[str, Any]) -> None:
    """Writes BASE_FILE, or checks that a resumed run adapts the same base (by checksum)."""
    path = out / BASE_FILE
    if path.exists():
        previous = json.loads(path.read_text())
        if previous["checkpoint_sha256"] != record["checkpoint_sha256"]:
            raise ValueError(f"{out} adapts base checkpoint {previous['checkpoint']} "
                             f"({previous['checkpoint_sha256'][:12]}), not {record['checkpoint']} "
                             f"({record['checkpoint_sha256'][:12]}): use a new --out or the same --base")
    else:
        path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def read_base_record(out: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The BASE_FILE of a run folder, None for runs without a base."""
    path = pathlib.Path(out) / BASE_FILE
    return json.loads(path.read_text()) if path.exists() else None


def adapt_base(model: tf.keras.Model, base_model: tf.keras.Model, record: dict[str, Any], out: pathlib.Path,
               update: str, num_train_examples: int) -> ParticleUpdate:
    """Records the base in `out` (BASE_FILE), copies its weights into the Bella model and freezes them."""
    record_base(out, record)
    copy_base_weights(base_model, model)
    freeze_base(model)
    return ParticleUpdate(model, update, num_train_examples)


class ParticleUpdate:
    """Per-particle losses -> the gradients an optimizer applies to the adapters (ensemble or SVGD)."""

    def __init__(self, model: tf.Module, update: str, num_train_examples: int):
        if update not in PARTICLE_UPDATES:
            raise ValueError(f"particle_update={update!r}: expected one of {PARTICLE_UPDATES}")
        if num_train_examples < 1:
            raise ValueError(f"num_train_examples must be >= 1, got {num_train_examples}")
        self.layers = adapted_layers(model)
        if not self.layers:
            raise ValueError("the model has no Bella adapters (posterior method 'bella')")
        self.variables = adapter_variables(model)
        self.update = update
        self.num_train = num_train_examples
        self.particles = self.layers[0].particles

    def neg_log_prior(self) -> tf.Tensor:
        """-log N(adapters_p; 0, s^2) of every particle, [P] (nats)."""
        terms = [-svgd.log_normal_density(v, layer.prior_stddev)
                 for layer in self.layers for v in layer.adapter_variables()]
        return tf.add_n(terms)

    def particle_losses(self, nll_per_particle: tf.Tensor) -> tf.Tensor:
        """loss_p = mean minibatch NLL_p - log prior_p / N_train, [P]: -log posterior_p / N_train."""
        return tf.cast(nll_per_particle, tf.float32) + self.neg_log_prior() / float(self.num_train)

    def objective(self, nll_per_particle: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(sum_p loss_p, the summed -log prior, its weight 1/N_train): a trainer's loss, "kl" and "kl_weight"."""
        loss = tf.reduce_sum(self.particle_losses(nll_per_particle))
        return loss, tf.reduce_sum(self.neg_log_prior()), tf.constant(1.0 / self.num_train)

    def gradients(self, grads: Sequence[tf.Tensor], variables: Sequence[tf.Variable]) -> list[tf.Tensor]:
        """Gradients of sum_p loss_p w.r.t. the adapters `variables` -> what the optimizer should descend.

        ensemble: unchanged (particle p only moves along its own loss). svgd: -phi / N_train,
        phi the SVGD direction with grad log p(x_p | D) = -N_train * grad loss_p; dividing by
        N_train keeps the step on the scale of a per-example loss, like the ensemble's.
        """
        grads = [tf.convert_to_tensor(g) for g in grads]
        if {v.ref() for v in variables} != {v.ref() for v in self.variables}:
            raise ValueError("particle gradients need exactly the model's adapter variables")
        if self.update == "ensemble":
            return grads
        p = self.particles
        flat_x = tf.concat([tf.reshape(v, [p, -1]) for v in variables], axis=1)
        flat_g = tf.concat([tf.reshape(g, [p, -1]) for g in grads], axis=1)
        phi = svgd.svgd_direction(flat_x, -float(self.num_train) * flat_g)
        step = -phi / float(self.num_train)
        sizes = [int(v.shape[1:].num_elements()) for v in variables]
        return [tf.reshape(part, v.shape) for part, v in zip(tf.split(step, sizes, axis=1), variables)]


def count_trainable(model: tf.Module) -> int:
    """Trainable scalars of a Bella model: the adapters of all particles."""
    return int(sum(v.shape.num_elements() for v in adapter_variables(model)))
