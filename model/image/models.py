"""Rank-1 Wide ResNet, ResNet-style and MLP image classifiers, every conv and dense layer from ``model.layers.factory``.

Batch layout (the same as the EHR model and edward2's rank-1 layers): the model tiles the
input batch of B images S*K times; row block k (S*B rows) belongs to ensemble member k and
every row draws its own rank-1 factors, so one forward pass yields S samples of each of the
K members. ``ImageModel(images, num_samples=S)`` returns logits [B, S*K, C] laid out
sample-major (column m = s*K + k), the layout of ``model.evaluation.statistics.metrics``.

Batch norm is never rank-1 (the paper's Appendix B); it is either shared by all members
(statistics over the whole tiled batch) or per member (a separate batch norm, with its own
scale, shift and moving statistics, for each row block).

MC dropout is the deterministic network with dropout on the input of every layer but the
first (Gal & Ghahramani 2016: Bernoulli noise on a layer's inputs is a distribution over its
weight rows), active at prediction time too.
"""
from __future__ import annotations

import tensorflow as tf

from model.image.config import RESNET_BLOCKS, ImageModelConfig
from model.layers import factory

__all__ = ["EnsembleBatchNorm", "ImageModel", "build_model", "count_parameters"]

_BN_EPSILON = 1e-5  # the Wide ResNet reference value (Keras' default is 1e-3)


class EnsembleBatchNorm(tf.keras.layers.Layer):
    """One batch norm per ensemble member: row block k of the tiled batch is normalised by norm k."""

    def __init__(self, ensemble_size: int, momentum: float = 0.9, epsilon: float = _BN_EPSILON, **kwargs):
        super().__init__(**kwargs)
        self.ensemble_size = ensemble_size
        self.norms = [tf.keras.layers.BatchNormalization(momentum=momentum, epsilon=epsilon, name=f"member_{k}")
                      for k in range(ensemble_size)]

    def call(self, inputs, training=None):
        parts = tf.split(inputs, self.ensemble_size, axis=0)
        return tf.concat([norm(part, training=training) for norm, part in zip(self.norms, parts)], axis=0)


def _batch_norm(config: ImageModelConfig, name: str) -> tf.keras.layers.Layer:
    if config.batch_norm == "per_member" and config.posterior.ensemble_size > 1:
        return EnsembleBatchNorm(config.posterior.ensemble_size, config.batch_norm_momentum, name=name)
    return tf.keras.layers.BatchNormalization(momentum=config.batch_norm_momentum, epsilon=_BN_EPSILON, name=name)


def _conv(filters: int, kernel: int, config: ImageModelConfig, stride: int, name: str) -> tf.keras.layers.Layer:
    # No bias: a batch norm follows every convolution and would cancel it.
    return factory.conv2d(filters, kernel, config.posterior, strides=stride, padding="same", use_bias=False, name=name)


class _Block(tf.keras.layers.Layer):
    """A residual basic block: two 3x3 convolutions, a 1x1 projection where the shape changes."""

    def __init__(self, config: ImageModelConfig, in_filters: int, filters: int, stride: int, preactivation: bool,
                 **kwargs):
        super().__init__(**kwargs)
        self.preactivation = preactivation
        self.dropout_rate = config.mc_dropout_rate
        self.bn1 = _batch_norm(config, "bn1")
        self.conv1 = _conv(filters, 3, config, stride, "conv1")
        self.bn2 = _batch_norm(config, "bn2")
        self.conv2 = _conv(filters, 3, config, 1, "conv2")
        self.project = in_filters != filters or stride != 1
        if self.project:
            self.shortcut = _conv(filters, 1, config, stride, "shortcut")
            # Post-activation ResNets normalise the projection as well (He et al. 2016).
            self.shortcut_bn = None if preactivation else _batch_norm(config, "shortcut_bn")

    def _drop(self, x):
        return tf.nn.dropout(x, rate=self.dropout_rate) if self.dropout_rate > 0 else x

    def call(self, x, training=None):
        if self.preactivation:  # Wide ResNet: BN-ReLU-conv, twice; the projection sees the activated input
            y = self._drop(tf.nn.relu(self.bn1(x, training=training)))
            shortcut = self.shortcut(y) if self.project else x
            y = self.conv1(y)
            y = self.conv2(self._drop(tf.nn.relu(self.bn2(y, training=training))))
            return y + shortcut
        x_in = self._drop(x)  # ResNet: conv-BN-ReLU-conv-BN, ReLU after the sum
        y = tf.nn.relu(self.bn1(self.conv1(x_in), training=training))
        y = self.bn2(self.conv2(self._drop(y)), training=training)
        shortcut = self.shortcut_bn(self.shortcut(x_in), training=training) if self.project else x
        return tf.nn.relu(y + shortcut)


class ImageModel(tf.keras.Model):
    """images [B, H, W, C] in [0, 1] -> logits [B, S*K, num_classes], sample-major."""

    def __init__(self, config: ImageModelConfig, num_classes: int, **kwargs):
        super().__init__(name=kwargs.pop("name", f"{config.architecture}_{config.depth}_{config.width}"), **kwargs)
        self.config = config
        self.num_classes = num_classes
        self.ensemble_size = config.posterior.ensemble_size
        self.dropout_rate = config.mc_dropout_rate
        w = config.width
        self.hidden = []
        if config.architecture == "mlp":
            # Paper 003's MLP (App. D.1): flattened pixels -> `depth` ReLU layers of `width` units -> head.
            self.hidden = [factory.dense(w, config.posterior, activation="relu", name=f"dense{i + 1}")
                           for i in range(config.depth)]
            self.head = factory.dense(num_classes, config.posterior, name="head")
            return
        if config.architecture == "wide_resnet":
            # Zagoruyko & Komodakis 2016: three groups of (depth - 4) / 6 blocks, 16w / 32w / 64w filters.
            per_group = (config.depth - 4) // 6
            stages = [(16 * w, 1, per_group), (32 * w, 2, per_group), (64 * w, 2, per_group)]
            stem_filters, preactivation = 16, True
        else:
            stages = [(16 * w * 2**i, 1 if i == 0 else 2, n) for i, n in enumerate(RESNET_BLOCKS[config.depth])]
            stem_filters, preactivation = 16 * w, False
        self.preactivation = preactivation
        self.stem = _conv(stem_filters, 3, config, 1, "stem")
        # Pre-activation blocks start with a BN; the network then ends with one. Post-activation
        # networks normalise the stem output instead.
        self.stem_bn = None if preactivation else _batch_norm(config, "stem_bn")
        self.blocks = []
        in_filters = stem_filters
        for g, (filters, stride, count) in enumerate(stages):
            for b in range(count):
                self.blocks.append(_Block(config, in_filters, filters, stride if b == 0 else 1, preactivation,
                                          name=f"group{g}_block{b}"))
                in_filters = filters
        self.final_bn = _batch_norm(config, "final_bn") if preactivation else None
        self.head = factory.dense(num_classes, config.posterior, name="head")

    def call(self, images, num_samples: int = 1, training=None):
        k, s = self.ensemble_size, num_samples  # s may be a tensor (predict_logits traces it once)
        batch = tf.shape(images)[0]
        # Copy c of the batch is member c // s, sample c % s: edward2 gives the first s*B rows to member 0.
        x = tf.tile(images, [s * k, 1, 1, 1])
        if self.hidden:
            x = tf.reshape(x, [tf.shape(x)[0], -1])
            for i, layer in enumerate(self.hidden):
                x = layer(tf.nn.dropout(x, rate=self.dropout_rate) if i > 0 and self.dropout_rate > 0 else x)
            if self.dropout_rate > 0:
                x = tf.nn.dropout(x, rate=self.dropout_rate)
            return self._member_major(self.head(x), batch)
        x = self.stem(x)
        if self.stem_bn is not None:
            x = tf.nn.relu(self.stem_bn(x, training=training))
        for block in self.blocks:
            x = block(x, training=training)
        if self.final_bn is not None:
            x = tf.nn.relu(self.final_bn(x, training=training))
        x = tf.reduce_mean(x, axis=[1, 2])
        if self.dropout_rate > 0:
            x = tf.nn.dropout(x, rate=self.dropout_rate)
        return self._member_major(self.head(x), batch)

    def _member_major(self, logits, batch):
        """[K*S*B, C] rows (member-major) -> [B, S*K, C], sample-major columns."""
        k, s = self.ensemble_size, tf.shape(logits)[0] // (batch * self.ensemble_size)
        logits = tf.reshape(logits, [k, s, batch, self.num_classes])
        return tf.reshape(tf.transpose(logits, [2, 1, 0, 3]), [batch, s * k, self.num_classes])


    @tf.function(input_signature=[tf.TensorSpec([None, None, None, None], tf.float32),
                                  tf.TensorSpec([], tf.int32)], autograph=False)
    def predict_logits(self, images, num_samples):
        """Logits [B, S*K, C] at prediction time; one trace serves every batch size and S."""
        return self(images, num_samples=num_samples, training=False)


def build_model(config: ImageModelConfig, image_shape: tuple[int, int, int], num_classes: int) -> ImageModel:
    """An ImageModel with its variables created (one forward pass on zeros of `image_shape`)."""
    model = ImageModel(config, num_classes)
    model(tf.zeros((1, *image_shape), tf.float32), num_samples=1, training=False)
    return model
