"""Framework adapters: Keras, tf.data and PyTorch. Each module imports its framework when it is imported,
so `outcore.Dataset` imports them only when one of its framework methods is called."""
