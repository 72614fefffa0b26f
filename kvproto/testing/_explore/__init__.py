"""The kit's explorer (KIT-23): a search over instances, sizes and interleavings judged by one model."""
