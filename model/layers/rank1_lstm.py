"""An LSTM layer for rank-1 (and deterministic) cells over a tiled [batch*K, T, d] batch.

The layer does not own parameters: it wraps a cell built by ``model.layers.factory.lstm_cell``
(edward2's ``LSTMCellRank1`` or a plain Keras ``LSTMCell``) and computes exactly what
``tf.keras.layers.RNN(cell)`` computes. Sharing the cell means the trainable variables, the
priors, the KL in ``losses`` and checkpoints are the reference's by construction.

Where it is used (measured, docs/model_layers.md): the EHR model's inference (evaluation and
serving, float32 and bfloat16), where it is faster than ``RNN(LSTMCellRank1)``, and Bella's
training (its cell would rebuild the adapted kernels at every step of keras' RNN). Rank-1
training runs keras' RNN over the same cell, which is no slower at the configured sizes.

What it adds over ``RNN(LSTMCellRank1)``:
  * Masking by sequence ``lengths`` (or any Keras mask); padded steps keep the state.
  * All factor noise for the batch is one ``tf.random.normal`` (one uniform for Cauchy)
    over the concatenated factors, instead of a distribution object per factor; explicit
    ``perturbations`` can be passed in (tests, evaluation with fixed draws).
  * One sample per sequence, constant over time, so r is applied to the whole input
    sequence in one pass, and additive perturbations fold into a per-sequence constant:
    (h + r) U + s = h U + (r U + s), costing nothing inside the loop.
  * A bare ``tf.while_loop`` over TensorArrays with a static trip count: XLA compiles it.
  * Inference in reduced precision (``call(..., matmul_dtype="bfloat16")``, used by the
    service's fast signature, never in training): both matmuls take bfloat16 operands
    (weights cast once per call) and every step's element-wise work (factor multiply, gates,
    mask, the cast of the next matmul's input) runs as one small XLA-compiled function.
    Without it, a step is ~15 separate TensorFlow ops on [B, 4u] tensors, which on a 2-core
    CPU costs as much as the bfloat16 matmul itself (docs/benchmarks.md, serving). bfloat16
    operands round to 8 bits of mantissa: tests bound the effect on the probabilities.
"""
from __future__ import annotations

import tensorflow as tf

from model.layers import FACTOR_SITES
from model.layers._edward2 import ed
from model.layers.noise import Noise, posterior_loc_scale, standard_draw

# Operand dtypes of the reduced-precision inference path (float32 = the exact path).
MATMUL_DTYPES = ("float32", "bfloat16")


def _site_family(cell: tf.keras.layers.Layer, site: str) -> str:
    init = getattr(cell, f"{site}_initializer")
    if isinstance(init, ed.initializers.TrainableNormal):
        return "normal"
    if isinstance(init, ed.initializers.TrainableCauchy):
        return "cauchy"
    if isinstance(init, tf.keras.layers.Layer):
        return "generic"  # any other edward2 trainable distribution: sampled via edward2
    return "point"  # a plain variable: BatchEnsemble factor


def _matmul(x: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
    """x [B, d] @ weights [d, o]; with per-particle weights [P, d, o], row block p uses weights[p]."""
    if weights.shape.rank == 3:
        p = weights.shape[0]
        return tf.reshape(tf.matmul(tf.reshape(x, [p, -1, weights.shape[1]]), weights), [-1, weights.shape[-1]])
    return tf.matmul(x, weights)


def _project_steps(x: tf.Tensor, kernel: tf.Tensor) -> tf.Tensor:
    """Time-major x [T, B, d] @ kernel for all steps in one matmul -> [T, B, o] (per-particle kernels too)."""
    steps, dim, out = tf.shape(x)[0], x.shape[-1], kernel.shape[-1]
    if kernel.shape.rank == 3:
        p = kernel.shape[0]
        blocks = tf.transpose(tf.reshape(x, [steps, p, -1, dim]), [1, 0, 2, 3])  # [P, T, B/P, d]
        proj = tf.matmul(tf.reshape(blocks, [p, -1, dim]), kernel)  # [P, T*B/P, o]
        return tf.reshape(tf.transpose(tf.reshape(proj, [p, steps, -1, out]), [1, 0, 2, 3]), [steps, -1, out])
    return tf.reshape(tf.matmul(tf.reshape(x, [-1, dim]), kernel), [steps, -1, out])


class Rank1LSTM(tf.keras.layers.Layer):
    """Runs an LSTM cell over [batch*K, T, d] inputs; padded steps are skipped via a mask."""

    def __init__(self, cell: tf.keras.layers.LSTMCell, *, return_sequences: bool = False,
                 return_state: bool = False, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(cell, tf.keras.layers.LSTMCell):
            raise TypeError(f"Rank1LSTM needs a Keras LSTMCell or edward2 LSTMCellRank1, got {type(cell)}")
        if cell.dropout or cell.recurrent_dropout:
            # Dropout masks would be per-step noise on top of the rank-1 noise: not supported.
            raise ValueError("Rank1LSTM does not support cell dropout / recurrent_dropout")
        self.cell = cell
        self.return_sequences = return_sequences
        self.return_state = return_state
        self.supports_masking = True

    @property
    def units(self) -> int:
        """Hidden size of the wrapped cell."""
        return self.cell.units

    @property
    def ensemble_size(self) -> int:
        """K; 1 for a deterministic Keras cell."""
        return getattr(self.cell, "ensemble_size", 1)

    @property
    def is_rank1(self) -> bool:
        """Whether the wrapped cell has rank-1 factors (rank-1 or BatchEnsemble)."""
        return hasattr(self.cell, "alpha_initializer")

    def build(self, input_shape):
        input_shape = tf.TensorShape(input_shape)
        if not self.cell.built:
            # Same as keras RNN.build: the cell sees one step, [batch, d].
            with tf.name_scope(self.cell.name):
                self.cell.build(tf.TensorShape([input_shape[0], input_shape[-1]]))
                self.cell.built = True
        super().build(input_shape)

    def sample_perturbations(self, batch_size, noise: Noise | None = None) -> dict[str, tf.Tensor]:
        """One sample of every rank-1 factor per row of the tiled batch: site -> [batch, dim].

        noise: draw from this explicit source (model.layers.noise; seeded prediction) instead of
        TensorFlow's stateful random ops.
        """
        if not self.is_rank1:
            return {}
        cell, k = self.cell, self.ensemble_size
        per_member = batch_size // k
        out: dict[str, tf.Tensor] = {}
        groups: dict[str, list[str]] = {"normal": [], "cauchy": []}
        for site in FACTOR_SITES:  # also the order the draws are concatenated in
            family = _site_family(cell, site)
            if family in groups:
                groups[family].append(site)
            elif family == "point":
                value = getattr(cell, site)
                out[site] = tf.reshape(
                    tf.broadcast_to(value[:, None, :], [k, per_member, value.shape[-1]]), [batch_size, -1])
            else:
                if noise is not None:
                    raise ValueError(f"{self.name}: factor {site!r} has a posterior that explicit noise cannot draw")
                init = getattr(cell, f"{site}_initializer")
                shape = getattr(cell, f"{site}_shape")
                draw = init(shape, self.dtype).distribution.sample(per_member)  # [E, K, dim]
                out[site] = tf.reshape(tf.transpose(draw, [1, 0, 2]), [batch_size, -1])
        for family, sites in groups.items():
            if not sites:
                continue
            params = [posterior_loc_scale(getattr(cell, f"{s}_initializer"))[1:] for s in sites]
            loc = tf.concat([p[0] for p in params], axis=-1)  # [K, D]
            scale = tf.concat([p[1] for p in params], axis=-1)
            # Rows are member-major (row block k = member k), as the draw's [K, E, D] reshape needs.
            eps = standard_draw(family, None if noise is None else noise.fold_in(f"{self.name}/{family}"), batch_size,
                                loc.shape[-1], loc.dtype)
            eps = tf.reshape(eps, [k, per_member, loc.shape[-1]])
            draw = tf.reshape(loc[:, None, :] + scale[:, None, :] * eps, [batch_size, -1])
            sizes = [p[0].shape[-1] for p in params]
            out.update(zip(sites, tf.split(draw, sizes, axis=-1)))
        return out

    def call(self, inputs, mask=None, lengths=None, perturbations=None, matmul_dtype=None, noise=None):
        """inputs [B, T, d]; mask [B, T] or lengths [B]; perturbations from sample_perturbations.

        noise: an explicit noise source (model.layers.noise) for the factor draws; rows of the batch are
        member-major blocks of the examples.

        matmul_dtype: None or "float32" (exact), or "bfloat16" for the inference-only fast path.
        """
        cell = self.cell
        x = tf.convert_to_tensor(inputs)
        reduced = matmul_dtype is not None and tf.as_dtype(matmul_dtype) != x.dtype
        if matmul_dtype is not None and tf.as_dtype(matmul_dtype).name not in MATMUL_DTYPES:
            raise ValueError(f"matmul_dtype={matmul_dtype!r}: expected one of {MATMUL_DTYPES}")
        batch, steps = tf.shape(x)[0], tf.shape(x)[1]
        if lengths is not None:
            mask = tf.sequence_mask(lengths, steps)
        # Time-major: the loop reads one [B, .] slice per step.
        x = tf.transpose(x, [1, 0, 2])
        if hasattr(cell, "particle_kernels"):
            # Bella (model.layers.bella): one (kernel, recurrent kernel) pair per row block, [P, ., 4u].
            kernel, recurrent_kernel = cell.particle_kernels()
        else:
            kernel = tf.convert_to_tensor(cell.kernel)
            recurrent_kernel = tf.convert_to_tensor(cell.recurrent_kernel)
        const = tf.convert_to_tensor(cell.bias) if cell.use_bias else None  # added at every step
        in_scale = rec_in = rec_out = None  # per-sequence factors around the two matmuls

        if self.is_rank1:
            p = perturbations if perturbations is not None else self.sample_perturbations(batch, noise)
            if const is not None:
                # Per-member bias [K, 4u] -> one row per sequence of the tiled batch.
                const = tf.reshape(tf.repeat(const[:, None, :], batch // self.ensemble_size, axis=1),
                                   [batch, 4 * cell.units])
            if cell.use_additive_perturbation:
                # (x + r) W + s = x W + (r W + s), and likewise for the recurrent term.
                shift = (tf.matmul(p["alpha"], kernel) + p["gamma"]
                         + tf.matmul(p["recurrent_alpha"], recurrent_kernel) + p["recurrent_gamma"])
                const = shift if const is None else const + shift
            else:
                x = x * p["alpha"]  # r is constant over time: one pass over the (narrow) inputs
                in_scale, rec_in, rec_out = p["gamma"], p["recurrent_alpha"], p["recurrent_gamma"]
        if reduced:
            # Inference only: the input projection for all steps in one matmul (cheap in
            # bfloat16), then the fused-step recurrence. The projection stays bfloat16: its
            # cast, factor and bias are applied inside each fused step, not as whole passes
            # over the [T, B, 4u] tensor.
            low = tf.as_dtype(matmul_dtype)
            proj = _project_steps(tf.cast(x, low), tf.cast(kernel, low))
            return self._fused_recurrence(proj, mask, tf.cast(recurrent_kernel, low), in_scale, const, rec_in,
                                          rec_out, x.dtype)
        return self._recurrence(x, kernel, in_scale, const, mask, recurrent_kernel, rec_in, rec_out)

    def _recurrence(self, seq, kernel, in_scale, const, mask, recurrent_kernel, rec_in, rec_out):
        """The float32 LSTM loop over time-major inputs seq [T, B, d]."""
        cell = self.cell
        steps, batch = tf.shape(seq)[0], tf.shape(seq)[1]
        act, rec_act = cell.activation, cell.recurrent_activation
        seq_ta, mask_ta, out_ta = self._loop_arrays(seq, mask)
        keep_outputs = self.return_sequences

        def body(t, h, c, out_ta):
            z = _matmul(seq_ta.read(t), kernel)
            if in_scale is not None:
                z = z * in_scale
            if const is not None:
                z = z + const
            rec = _matmul(h * rec_in if rec_in is not None else h, recurrent_kernel)
            if rec_out is not None:
                rec = rec * rec_out
            z_i, z_f, z_c, z_o = tf.split(z + rec, 4, axis=-1)
            c_new = rec_act(z_f) * c + rec_act(z_i) * act(z_c)
            h_new = rec_act(z_o) * act(c_new)
            out = h_new
            if mask_ta is not None:
                # Padded steps keep the state and emit zeros.
                valid = mask_ta.read(t)
                out = tf.where(valid, h_new, tf.zeros_like(h_new))
                h_new = tf.where(valid, h_new, h)
                c_new = tf.where(valid, c_new, c)
            if keep_outputs:
                out_ta = out_ta.write(t, out)
            return t + 1, h_new, c_new, out_ta

        zeros = tf.zeros([batch, cell.units], seq.dtype)
        # maximum_iterations gives XLA a static trip count for the TensorArrays.
        _, h, c, out_ta = tf.while_loop(
            lambda t, *_: t < steps, body, (tf.constant(0), zeros, zeros, out_ta),
            maximum_iterations=steps, parallel_iterations=32)
        return self._loop_result(out_ta, h, c)

    def _loop_arrays(self, seq, mask, out_dtype=None):
        """TensorArrays the loops read (seq, mask) and write (outputs; a dummy scalar without them)."""
        steps = tf.shape(seq)[0]
        # TensorArrays rather than seq[t]: slicing a captured tensor inside a while loop
        # makes its gradient a dense [T, ...] accumulation per step (quadratic in T).
        seq_ta = tf.TensorArray(seq.dtype, size=steps).unstack(seq)
        mask_ta = None
        if mask is not None:
            mask_ta = tf.TensorArray(tf.bool, size=steps).unstack(tf.transpose(tf.cast(mask, tf.bool))[:, :, None])
        out_ta = tf.TensorArray(out_dtype or seq.dtype, size=steps) if self.return_sequences else tf.constant(0)
        return seq_ta, mask_ta, out_ta

    def _loop_result(self, out_ta, h, c):
        """The layer's return value from the loop's outputs and final state."""
        output = tf.transpose(out_ta.stack(), [1, 0, 2]) if self.return_sequences else h
        if self.return_state:
            return [output, h, c]
        return output

    def _fused_step_fn(self, low: tf.DType):
        """The XLA-compiled element-wise part of one inference step (built once per layer and dtype)."""
        # Kept in __dict__ directly: Keras would otherwise try to track the functions.
        cache = self.__dict__.setdefault("_fused_steps", {})
        fn = cache.get(low.name)
        if fn is None:
            act, rec_act = self.cell.activation, self.cell.recurrent_activation

            def step(rec, z_in, h, c, in_scale, const, rec_in, rec_out, valid):
                z_in, rec = tf.cast(z_in, h.dtype), tf.cast(rec, h.dtype)
                if in_scale is not None:
                    z_in = z_in * in_scale
                if const is not None:
                    z_in = z_in + const
                z_i, z_f, z_c, z_o = tf.split(z_in + (rec * rec_out if rec_out is not None else rec), 4, axis=-1)
                c_new = rec_act(z_f) * c + rec_act(z_i) * act(z_c)
                h_new = rec_act(z_o) * act(c_new)
                out = h_new
                if valid is not None:
                    out = tf.where(valid, h_new, tf.zeros_like(h_new))
                    h_new = tf.where(valid, h_new, h)
                    c_new = tf.where(valid, c_new, c)
                # The next step's matmul operand, already scaled and cast: one kernel fewer.
                nxt = h_new * rec_in if rec_in is not None else h_new
                return h_new, c_new, out, tf.cast(nxt, low)

            fn = cache[low.name] = tf.function(step, jit_compile=True, autograph=False)
        return fn

    def _fused_recurrence(self, proj, mask, recurrent_kernel, in_scale, const, rec_in, rec_out, dtype):
        """Inference recurrence over low-precision input projections proj [T, B, 4u]; state and outputs in dtype."""
        if mask is None:
            return self._fused_loop(proj, None, recurrent_kernel, in_scale, const, rec_in, rec_out, dtype)
        # When every sequence fills the padded length (always so for one admission, whose S*K rows
        # share its bag count) the mask selects nothing: the loop without it is exact and skips
        # three selects and a mask read per step (~2-3 ms of a 100-row, 30-step, 512-unit pass).
        return tf.cond(tf.reduce_all(tf.cast(mask, tf.bool)),
                       lambda: self._fused_loop(proj, None, recurrent_kernel, in_scale, const, rec_in, rec_out, dtype),
                       lambda: self._fused_loop(proj, mask, recurrent_kernel, in_scale, const, rec_in, rec_out, dtype))

    def _fused_loop(self, proj, mask, recurrent_kernel, in_scale, const, rec_in, rec_out, dtype):
        """The fused recurrence's while loop; mask None: every step of every sequence is valid."""
        step_fn = self._fused_step_fn(recurrent_kernel.dtype)
        steps, batch = tf.shape(proj)[0], tf.shape(proj)[1]
        proj_ta, mask_ta, out_ta = self._loop_arrays(proj, mask, dtype)
        keep_outputs = self.return_sequences

        def body(t, h, c, nxt, out_ta):
            valid = mask_ta.read(t) if mask_ta is not None else None
            h, c, out, nxt = step_fn(_matmul(nxt, recurrent_kernel), proj_ta.read(t), h, c, in_scale, const, rec_in,
                                     rec_out, valid)
            if keep_outputs:
                out_ta = out_ta.write(t, out)
            return t + 1, h, c, nxt, out_ta

        zeros = tf.zeros([batch, self.cell.units], dtype)
        _, h, c, _, out_ta = tf.while_loop(
            lambda t, *_: t < steps, body,
            (tf.constant(0), zeros, zeros, tf.zeros([batch, self.cell.units], recurrent_kernel.dtype), out_ta),
            maximum_iterations=steps, parallel_iterations=32)
        return self._loop_result(out_ta, h, c)

    def compute_mask(self, inputs, mask=None):
        if self.return_sequences:
            return [mask, None, None] if self.return_state else mask
        return [None, None, None] if self.return_state else None
