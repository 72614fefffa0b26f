"""The executable side of the kvproto specification: reference definitions checked by CrossHair and Hypothesis."""
