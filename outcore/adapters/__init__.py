"""Framework adapters: Keras, tf.data and PyTorch. Each imports its framework only when used."""
