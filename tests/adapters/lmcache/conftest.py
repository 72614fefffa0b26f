"""The LMCache adapter's tests run against the real LMCache 0.5.6 wheel (./dev and .ci/run install
it); LMCache never posts usage statistics from them."""

import os

os.environ["LMCACHE_TRACK_USAGE"] = "false"
