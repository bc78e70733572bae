# autopar port: tensorflow/benchmarks scripts/tf_cnn_benchmarks/models/__init__.py at 8fb79079265933ad39bea628b777af662f5bf15d (empty there too).
