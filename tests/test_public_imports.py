"""Every public import that worked before the kit's house was rebuilt (issue 36) still works.

The names are what each public module's ``__all__`` held at c7d6429, the last commit before the kit's
private modules moved into wings and the simulator and scan verifier moved out of the kit: a user's
``from MODULE import NAME`` of any of them must keep working, whatever moved behind it. A name may be
added to a public module; none of these may go.
"""

from __future__ import annotations

import importlib

import pytest

#: module -> the names its ``__all__`` promised before (c7d6429).
BEFORE: dict[str, tuple[str, ...]] = {
    "kvproto": (
        "AsyncProbe", "BatchCheck", "BatchLookup", "BlockState", "Capabilities", "Decision", "Defer", "EventKind",
        "Hits", "JobResult", "JobTimeBound", "LookupResult", "MAX_GROUP", "MemoryPrimaryTier", "MemoryTier",
        "OffloadKey", "OffloadingEvent", "OffloadingManager", "PrepareStoreOutput", "PrimaryTier", "ReadyKeys",
        "ReqContext", "SecondaryTier", "SlotQuarantine", "TierLifecycle", "TieringConfig", "TieringManager",
        "TieringStats", "TransferJob", "__version__", "as_legacy", "errors", "make_key", "maximal_prefix_lookup",
        "sliding_window_lookup", "split_key", "unreachable",
    ),
    "kvproto.envelope": (
        "ALGORITHMS", "Algorithm", "EnvelopeError", "EnvelopeField", "FORMAT_VERSION", "HEADER_BYTES", "Header",
        "MAGIC", "MAX_KEY_BYTES", "NAMESPACE_BYTES", "algorithm_available", "checksum", "copy_verified",
        "decode_header", "default_algorithm", "encode", "encode_header", "key_digest", "namespace_id",
        "namespace_manifest", "verify", "verify_header", "verify_payload",
    ),
    "kvproto.errors": (
        "ConfigurationError", "ContractViolation", "InvalidArgumentError", "InvalidKeyError", "KvprotoError",
        "TierError", "TierMisuseError",
    ),
    "kvproto.members": (
        "HIT", "HIT_PENDING", "MISS", "RETRY",
    ),
    "kvproto.metrics": (
        "Buckets", "JobFigures", "KvMetrics", "LATENCY_BUCKETS_S", "METRICS", "MeteredSecondary", "MetricsServer",
        "MetricsUnavailable", "STEP_BUCKETS", "TierFigures",
    ),
    "kvproto.scan": (
        "Decision", "Defer", "Hits", "as_legacy", "maximal_prefix_lookup", "sliding_window_lookup",
    ),
    "kvproto.testing": (
        "CheckInfo", "ConformanceFailure", "DifferentialStateMachine", "FaultyBackend", "ForwardingBackend",
        "KitLimits", "KitProfile", "MEMORY_HOOKS", "OpFault", "PROFILES", "PROGRAMMING_ERRORS", "PrimaryDriver",
        "PrimaryStateMachine", "PrimaryTierFactory", "PrimaryTierTests", "Rebuilds", "SecondaryDriver",
        "SecondaryTierFactory", "SecondaryTierTests", "ThreadLedger", "TierSpec", "TierStateMachine",
        "TrackedContext", "block_for", "build_secondary_tier", "check", "checks_of", "fresh_directory", "key_pool",
        "make_buffer", "programming_errors_logged", "row", "split_kit_options", "tricky_keys",
    ),
    "kvproto.testing.faults": (
        "FaultyPrimary", "FaultySecondary", "LatencySecondary", "PRIMARY_METHODS", "RaiseRule", "SECONDARY_METHODS",
    ),
    "kvproto.testing.plugin": (
        "pytest_addoption", "pytest_configure", "pytest_runtest_makereport", "pytest_terminal_summary",
    ),
    "kvproto.testing.scans": (
        "COUNTEREXAMPLES", "CROSSHAIR_ITERATIONS", "CROSSHAIR_TARGETS", "Check", "CheckResult", "Counterexample",
        "EXPRESSIBLE", "LEGACY_ANSWER", "PrefixScan", "Property", "PropertyFailure", "ScanKind", "ScanRun",
        "ScanTarget", "WindowScan", "adapt", "crosshair_available", "crosshair_check", "crosshair_diff",
        "crosshair_diff_check", "exhaustive_prefix", "exhaustive_window", "key_of", "legacy_conflation",
        "prefix_entry", "prefix_run", "reference_prefix_scan", "reference_window_scan", "run_checks", "run_property",
        "scan_properties", "scan_target", "show_decision", "standard_checks", "target_checks", "window_entry",
        "window_run",
    ),
    "kvproto.testing.stateful": (
        "DifferentialStateMachine", "PrimaryStateMachine", "TierStateMachine",
    ),
    "kvproto.testing.strategies": (
        "JobOp", "LoadOp", "LookupOp", "StepOp", "StoreOp", "block_hashes", "blocks", "groups", "job_sequences",
        "key_lists", "keys", "sibling_keys",
    ),
    "kvproto.tierkit": (
        "ArcPolicy", "AsyncBlobBackend", "AsyncBlobBytes", "AsyncExistenceBatches", "BlobBackend", "BlobTier",
        "BlobTierConfig", "BlobTierStats", "BlockState", "EvictionPolicy", "ExistenceBatches", "ForwardingPrimary",
        "ForwardingSecondary", "HOST_PRIMARY_CAPABILITIES", "HeldExistence", "HeldReads", "JobAdmission", "LruPolicy",
        "MAX_PENDING_EVENTS", "MemoryBackend", "PROBE_CHUNK_KEYS", "PolicyName", "PublishBatches", "Published",
        "ReadBatches", "ReadyFlags",
        "SlotStats", "SlotTable", "blob_name", "declared_capabilities", "make_policy", "ready_flags",
        "ready_prefix_scan", "ready_window_scan", "slot_buffer_shape",
    ),
    "kvproto_fs": (
        "FileBackend", "FileOps", "FsTier", "FsTierConfig", "FsTierStats", "LayoutValue", "conformance_spec",
    ),
    "kvproto_mooncake": (
        "KitRun", "LayoutValue", "LocalMooncake", "MOONCAKE_HOOKS", "MooncakeBackend", "MooncakeError", "MooncakeOps",
        "MooncakeTier", "MooncakeTierConfig", "MooncakeTierStats", "conformance_spec", "faults_of", "mooncake_spec",
    ),
    "kvproto_obj": (
        "LayoutValue", "OBJ_HOOKS", "ObjTier", "ObjTierConfig", "ObjTierStats", "ObstoreBackend", "StoreKind",
        "StoreOps", "conformance_spec", "faults_of", "make_store", "obj_spec",
    ),
    "kvproto_cpu": (
        "ArcPolicy", "BlockState", "CpuTier", "CpuTierConfig", "CpuTierStats", "CpuTransferHandler", "DeviceLayout",
        "EvictionPolicy", "LruPolicy", "SlotBuffer", "TransferOutcome", "allocate_slot_buffer", "conformance_spec",
        "make_policy",
    ),
    "kvproto_vllm": (
        "KvprotoTier", "VllmPrimaryTier", "VllmSecondaryTier", "as_slot_buffer", "build_kvproto_tier",
    ),
    "kvproto_lmcache": (
        "KvprotoL2Adapter", "LmcacheSecondaryTier",
    ),
    "kvproto_sglang": (
        "KvprotoHiCacheStorage",
    ),
    "kvproto_sglang.testing": (
        "SglangStorageTests",
    ),
    "kvproto_vllm.testing": (
        "VllmTierTests",
    ),
}


@pytest.mark.parametrize("module", sorted(BEFORE))
def test_every_public_name_of_before_still_imports(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [name for name in BEFORE[module] if not hasattr(mod, name)]
    assert missing == []
    still_promised = set(getattr(mod, "__all__", ()))
    assert [name for name in BEFORE[module] if name not in still_promised] == []
