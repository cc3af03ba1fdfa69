"""The EHR mortality model: stochastic code embeddings -> bag vectors -> rank-1 LSTM -> dense -> logit.

Forward pass for N admissions, S samples and K members (docs/model.md has the picture):

  1. every code of every bag is looked up in one embedding table (stochastic for the
     Bayesian methods), once per sample: the table is shared by the K members (paper
     Section 4.4), so it is evaluated on the S-tiled tokens, not on the K*S-tiled batch;
  2. a token is tanh(Dense([embedding, value features])): the value features (z-scores,
     has_value, log count) modulate each code's own vector, so "high lactate" and "high
     creatinine" need not point the same way; this projection is deterministic and shared
     by the members, like the embeddings (the paper keeps embeddings out of the rank-1 part);
  3. a bag pools its tokens (``ModelConfig.pooling``: mean, sum, max, mean and max, or
     attention) and adds its time features (hours before trigger, size, in admission);
  4. the [S*N, bags, d] sequence is tiled K times (row block k = member k, as every
     rank-1 layer expects) and run through the LSTM masked by num_bags;
  5. the final state, concatenated with the admission context, goes through a dense
     hidden layer and a dense output layer (one logit per row);
  6. with ``ModelConfig.wide``, a linear layer adds its logit from the admission window's
     per-code aggregates (model.ehr.inputs "window_aggregates"): the extremes a severity score sums,
     which the LSTM would otherwise have to carry across bags itself. It is a factory layer under
     the method's posterior, or (``wide_posterior: laplace``) a fitted logistic regression with
     its Laplace posterior (model.ehr.wide).

The result is reshaped to [N, S*K], sample-major (column m = s*K + k), the layout of
``model.evaluation.statistics.metrics``. Layers come from the factory ``model.layers.factory``; which posterior they carry
is data (``ModelConfig.method``).
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import tensorflow as tf

from model.layers import factory
from model.layers.embeddings import EmbeddingConfig, StochasticEmbedding
from model.layers.noise import Noise, call_sampling
from model.layers.rank1_lstm import Rank1LSTM
from model.ehr.config import ModelConfig
from model.ehr.inputs import bag_feature_dim, context_dim, value_feature_dim
from model.ehr.wide import GaussianLinear


class HeadInputs(NamedTuple):
    """What the logit layers read: rows k*(S*N) + j*N + i (member k, sample j, admission i)."""

    hidden: tf.Tensor  # [K*S*N, hidden_layer_dim] the hidden layer's output
    wide: tf.Tensor | None  # [K*S*N, window_aggregate_dim] the wide part's input (None: no wide part)
    admissions: tf.Tensor  # N, scalar int32
    samples: tf.Tensor  # S, scalar int32


class EHRModel(tf.keras.Model):
    """features (model.ehr.inputs.Featurizer output) -> logits [N, S*K], sample-major."""

    def __init__(self, config: ModelConfig, vocab_size: int, window_aggregate_dim: int | None = None, **kwargs):
        super().__init__(**kwargs)
        if config.wide and not window_aggregate_dim:
            raise ValueError("a wide model needs window_aggregate_dim (Featurizer.window_aggregate_dim)")
        self.config = config
        self.window_aggregate_dim = window_aggregate_dim if config.wide else None
        self.ensemble_size = config.ensemble_size
        posterior = config.posterior
        reg = tf.keras.regularizers.l2(config.l2) if config.l2 > 0 else None
        self.embedding = StochasticEmbedding(
            vocab_size, config.embedding_dim,
            EmbeddingConfig(stochastic=config.stochastic_embeddings, prior_stddev=config.embedding_prior_stddev,
                            init_stddev=config.embedding_init_stddev),
            name="code_embedding")
        self.token = tf.keras.layers.Dense(config.embedding_dim, activation="tanh", kernel_regularizer=reg,
                                           name="token_projection")
        # A deterministic, shared scorer like the token projection: one learned query.
        self.attention = (tf.keras.layers.Dense(config.attention_heads, use_bias=False, name="attention_query")
                          if config.pooling == "attention" else None)
        cell = factory.lstm_cell(config.rnn_dim, posterior, name="lstm_cell")
        # Two loops over one cell (same variables, priors and KL; checkpoints see "lstm/cell"):
        # training runs keras' RNN, which at the configured sizes is no slower than our loop
        # (docs/model_layers.md); inference runs Rank1LSTM, which is faster there and has the
        # bfloat16 path. Flipout cells resample their weights in get_initial_state, which only
        # keras' RNN calls, and Bella's cell would rebuild its adapted kernels every step in it.
        self.lstm = tf.keras.layers.RNN(cell, name="lstm")
        # Same layer name: whichever loop builds the cell first, its variables are "lstm/lstm_cell/..."
        # (Bella maps a deterministic base's weights by name).
        self.fast_lstm = None if factory.samples_weights(posterior) else Rank1LSTM(cell, name="lstm")
        self.train_with_fast_lstm = config.method == "bella"
        self.hidden = factory.dense(config.hidden_layer_dim, posterior, activation="relu", name="hidden")
        self.output_layer = factory.dense(1, posterior, name="logit")
        self.wide = None
        if config.wide and config.wide_posterior == "laplace":
            self.wide = GaussianLinear(window_aggregate_dim, name="wide_logit")
        elif config.wide:  # no bias: the output layer has one
            self.wide = factory.dense(1, posterior, use_bias=False, name="wide_logit",
                                    kernel_regularizer=tf.keras.regularizers.L1(config.wide_l1) if config.wide_l1
                                    else None)

    def build_for_inputs(self) -> None:
        """Creates every variable with a one-admission dummy batch (needed before restoring checkpoints)."""
        ids = tf.RaggedTensor.from_nested_row_lengths(tf.zeros([1], tf.int64), [[1], [1]])
        vals = tf.RaggedTensor.from_nested_row_lengths(tf.zeros([1, value_feature_dim(self.config.time_inputs)]), [[1], [1]])
        bags = tf.RaggedTensor.from_row_lengths(tf.zeros([1, bag_feature_dim(self.config.time_inputs)]), [1])
        features = {"code_ids": ids, "code_values": vals, "bag_features": bags, "num_bags": tf.ones([1], tf.int32),
                    "context": tf.zeros([1, context_dim(self.config.time_inputs)])}
        if self.wide is not None:
            features["window_aggregates"] = tf.zeros([1, self.window_aggregate_dim])
        self(features, num_samples=1, training=True)
        self(features, num_samples=1, training=False)

    def call(self, features: Mapping[str, Any], num_samples: int | tf.Tensor = 1, training=None,
             matmul_dtype: str | None = None, noise: Noise | None = None) -> tf.Tensor:
        """Logits [N, S*K] (float32), column s*K + k = sample s of member k.

        matmul_dtype "bfloat16": the LSTM's matmuls in bfloat16 (inference only, see
        model.layers.rank1_lstm); None / "float32": exact. The Keras-RNN (fully Bayesian) LSTM ignores it.
        noise: every layer draws from this explicit source (model.layers.noise, one key per admission)
        instead of TensorFlow's stateful random ops; None: stateful draws (training).
        """
        return self.head(self.trunk(features, num_samples, training, matmul_dtype, noise), noise=noise)

    def trunk(self, features: Mapping[str, Any], num_samples: int | tf.Tensor = 1, training=None,
              matmul_dtype: str | None = None, noise: Noise | None = None) -> HeadInputs:
        """Steps 1-5 up to the output layer: what the logit layers read (call's arguments).

        Noise sites are named per layer, so the head drawn apart from the trunk draws what call
        draws: model revision (model.adapt.revision) runs the trunk once and the head per step.
        """
        # Every method samples its posterior in training and evaluation alike; `training` only
        # picks which of the two equivalent LSTM loops runs.
        ids = features["code_ids"]  # ragged [N, (T), (C)]
        num_bags = tf.cast(features["num_bags"], tf.int32)
        n = tf.shape(num_bags)[0]
        s = tf.convert_to_tensor(num_samples, tf.int32)
        k = self.ensemble_size

        # 1-2. tokens, S times (one embedding sample per token per sample).
        tok_ids = ids.flat_values
        n_tok = tf.shape(tok_ids)[0]
        # Each admission's tokens are contiguous in every one of the S copies.
        tokens_noise = None if noise is None else noise.grouped(tf.reduce_sum(ids.row_lengths(axis=2), axis=1))
        emb = self.embedding(tf.tile(tok_ids, [s]), noise=tokens_noise)
        values = tf.tile(tf.cast(features["code_values"].flat_values, emb.dtype), [s, 1])
        tokens = self.token(tf.concat([emb, values], axis=-1))  # [S*n_tok, D]

        # 3. pool each bag's tokens; sample j's bags are segments j*n_bags .. (j+1)*n_bags.
        tok_bag = tf.cast(ids.values.value_rowids(), tf.int32)  # [n_tok] bag index
        n_bags = tf.cast(ids.values.nrows(), tf.int32)
        offsets = tf.repeat(tf.range(s) * n_bags, n_tok)
        pooled = self._pool(tokens, tf.tile(tok_bag, [s]) + offsets, s * n_bags)
        bag_feats = tf.cast(features["bag_features"].flat_values, pooled.dtype)
        pooled = tf.concat([pooled, tf.tile(bag_feats, [s, 1])], axis=-1)  # [S*n_bags, F]
        width = pooled.shape[-1]
        per_bag = tf.transpose(tf.reshape(pooled, [s, n_bags, width]), [1, 0, 2])  # [n_bags, S, F]
        seq = tf.RaggedTensor.from_row_splits(per_bag, tf.cast(ids.row_splits, tf.int32)).to_tensor()
        # [N, T, S, F] -> [S*N, T, F]; at least one (masked) step so all-empty batches run.
        steps = tf.shape(seq)[1]
        seq = tf.reshape(tf.transpose(seq, [2, 0, 1, 3]), [s * n, steps, width])
        seq = tf.pad(seq, [[0, 0], [0, tf.maximum(1 - steps, 0)], [0, 0]])

        # 4. member tiling: rows k*(S*N) + j*N + i = member k, sample j, admission i.
        x = tf.tile(seq, [k, 1, 1])
        lengths = tf.tile(num_bags, [s * k])
        # Rows from here on: K*S blocks of the N admissions, one row each (the noise's default layout).
        if self.fast_lstm is None or (training and not self.train_with_fast_lstm):
            mask = tf.sequence_mask(lengths, tf.shape(x)[1])
            if noise is None:
                h = self.lstm(x, mask=mask)
            else:
                # Explicit weights and signs enter as RNN constants; an explicit initial state keeps
                # Keras from calling the cell's (stateful) get_initial_state.
                rows, units = tf.shape(x)[0], self.lstm.cell.units
                zeros = tf.zeros([rows, units], x.dtype)
                h = self.lstm(x, mask=mask, initial_state=[zeros, zeros],
                              constants=self.lstm.cell.explicit_draws(noise, rows, x.dtype))
        else:
            h = self.fast_lstm(x, lengths=lengths, matmul_dtype=matmul_dtype, noise=noise)
        context = tf.tile(tf.cast(features["context"], h.dtype), [s * k, 1])

        # 5. the hidden layer; the wide part's input tiled like every row.
        z = call_sampling(self.hidden, tf.concat([h, context], axis=-1), noise=noise)
        wide_in = (None if self.wide is None
                   else tf.tile(tf.cast(features["window_aggregates"], z.dtype), [s * k, 1]))
        return HeadInputs(z, wide_in, n, s)

    def head(self, inputs: HeadInputs, noise: Noise | None = None) -> tf.Tensor:
        """Steps 5-6 from the hidden layer's output: logits [N, S*K] (float32), sample-major."""
        logits = call_sampling(self.output_layer, inputs.hidden, noise=noise)[:, 0]
        if self.wide is not None:
            logits += call_sampling(self.wide, inputs.wide, noise=noise)[:, 0]
        logits = tf.cast(logits, tf.float32)  # float32 even under mixed precision
        n, s, k = inputs.admissions, inputs.samples, self.ensemble_size
        return tf.reshape(tf.transpose(tf.reshape(logits, [k, s, n]), [2, 1, 0]), [n, s * k])


    def _pool(self, tokens: tf.Tensor, segments: tf.Tensor, num_segments: tf.Tensor) -> tf.Tensor:
        """[n_tokens, D] token vectors -> [num_segments, D] (2D for mean_max) bag vectors; empty bags -> 0."""
        pooling = self.config.pooling
        if pooling == "mean":
            return tf.math.unsorted_segment_mean(tokens, segments, num_segments)
        if pooling == "sum":
            return tf.math.unsorted_segment_sum(tokens, segments, num_segments)
        if pooling in ("max", "mean_max"):
            # Tokens are tanh outputs in (-1, 1); an empty bag's max (the dtype's lowest) becomes 0.
            high = tf.math.unsorted_segment_max(tokens, segments, num_segments)
            high = tf.where(high < -1.0, tf.zeros_like(high), high)
            if pooling == "max":
                return high
            return tf.concat([tf.math.unsorted_segment_mean(tokens, segments, num_segments), high], axis=-1)
        # attention: per head, a softmax over each bag's tokens, stabilised by the bag's largest score.
        scores = self.attention(tokens)  # [n_tokens, H]
        top = tf.math.unsorted_segment_max(scores, segments, num_segments)
        weights = tf.exp(scores - tf.gather(top, segments))
        total = tf.math.unsorted_segment_sum(weights, segments, num_segments)
        weights = weights / tf.gather(total, segments)
        pooled = tf.math.unsorted_segment_sum(weights[:, :, None] * tokens[:, None, :], segments, num_segments)
        return tf.reshape(pooled, [num_segments, self.config.attention_heads * tokens.shape[-1]])


def bag_vector_dim(config: ModelConfig) -> int:
    """Width of one LSTM input step: the pooled tokens (2 or attention_heads x embedding_dim) and the bag features."""
    width = {"mean_max": 2, "attention": config.attention_heads}.get(config.pooling, 1)
    return config.embedding_dim * width + bag_feature_dim(config.time_inputs)


def build_model(config: ModelConfig, vocab_size: int, window_aggregate_dim: int | None = None) -> EHRModel:
    """A built EHRModel (variables created) for a vocabulary of vocab_size ids (and a wide part's input width)."""
    model = EHRModel(config, vocab_size, window_aggregate_dim, name="ehr_model")
    model.build_for_inputs()
    return model
