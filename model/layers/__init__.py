"""The Bayesian building blocks every model here is made of: the posteriors over weights and
how they become Keras layers.

``factory`` is the layer factory (a ``PosteriorConfig`` from ``posterior`` -> dense, conv and LSTM
layers); beside it the posterior families it draws on (edward2's rank-1 factors through
``_edward2``, ``weight_posteriors``' whole-matrix Gaussians, ``bella``'s particle adapters moved
by ``svgd``), the stochastic code embeddings, the masked rank-1 LSTM and the explicit noise
(``noise``) that makes seeded prediction reproducible.

Nothing here knows about training, evaluation or export: those packages build on this one.
Importing this package is cheap (no TensorFlow); its modules are not.
"""

# Attribute prefixes of edward2's rank-1 multiplicative factors (<site>_initializer,
# <site>_regularizer, <site>_shape on a layer or LSTM cell). One list, because the KL, the
# fast-weight learning rate and the LSTM's batched factor draw must agree on what a factor is.
FACTOR_SITES: tuple[str, ...] = ("alpha", "gamma", "recurrent_alpha", "recurrent_gamma")
