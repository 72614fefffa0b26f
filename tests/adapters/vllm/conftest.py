"""The vLLM adapter's tests run against the real vLLM 0.33.0 wheel; see vllm_support.py for the two
leaf modules replaced where vLLM's full dependency set is not installed."""

from tests.adapters.vllm import vllm_support

vllm_support.install()
