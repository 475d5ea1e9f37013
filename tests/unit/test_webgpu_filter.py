"""The WebGPU filter (proposal, "Properties > Vulkan" and "API"), on recorded and synthetic
lists. Every expected value here is written out from the proposal's rules, not computed."""

from __future__ import annotations

import pytest
from conftest import load_record

from coopmat.common.enums import ComponentType as CT
from coopmat.common.enums import Scope
from coopmat.device.model import CooperativeMatrixProperties as P
from coopmat.device.webgpu import (
    GPUSubgroupMatrixConfig as Cfg,
)
from coopmat.device.webgpu import (
    filter_configs,
    subgroup_matrix_support,
)

ALL_FEATURES = {"cooperativeMatrix": True, "vulkanMemoryModel": True,
                "subgroupSizeControl": True, "computeFullSubgroups": True,
                "shaderFloat16": True}
COMPUTE = 0x20


def entry(m, n, k, a, b=None, c=None, r=None, sat=False, scope=Scope.SUBGROUP) -> P:
    b = a if b is None else b
    c = a if c is None else c
    r = c if r is None else r
    return P(M=m, N=n, K=k, a_type=int(a), b_type=int(b), c_type=int(c), result_type=int(r),
             saturating_accumulation=sat, scope=int(scope))


def configs(props, shader_f16=True, device_f16=True):
    return [e.config for e in filter_configs(props, shader_f16=shader_f16,
                                             device_shader_float16=device_f16) if e.config]


def reasons(props, **kw):
    kw.setdefault("shader_f16", True)
    kw.setdefault("device_shader_float16", True)
    return [e.reasons for e in filter_configs(props, **kw)]


def recorded(name: str) -> list[P]:
    return [P.from_record(d) for d in load_record(name)["configs"]]


def test_lavapipe_recorded_list():
    assert configs(recorded("lavapipe-mesa26-khr-coopmat.json")) == [
        Cfg("f16", "f16", 8, 8, 8),
        Cfg("f16", "f32", 8, 8, 8),
        Cfg("u8", "u32", 8, 8, 8),
        Cfg("i8", "i32", 8, 8, 8),
    ]


def test_h200_recorded_list_keeps_driver_order_and_drops_bf16():
    props = recorded("nvidia-h200-khr-coopmat.json")
    assert len(props) == 11
    assert configs(props) == [
        Cfg("f16", "f16", 16, 16, 16), Cfg("f16", "f16", 16, 8, 16), Cfg("f16", "f16", 16, 8, 8),
        Cfg("f16", "f32", 16, 16, 16), Cfg("f16", "f32", 16, 8, 16), Cfg("f16", "f32", 16, 8, 8),
        Cfg("u8", "u32", 16, 16, 32), Cfg("i8", "i32", 16, 16, 32),
        Cfg("u8", "u32", 16, 8, 32), Cfg("i8", "i32", 16, 8, 32),
    ]
    last = filter_configs(props, shader_f16=True, device_shader_float16=True)[-1]
    assert last.properties.a_type == CT.BFLOAT16 == 1000141000
    assert last.config is None
    assert last.reasons == ("A type BFLOAT16 is not a WebGPU component type",
                            "B type BFLOAT16 is not a WebGPU component type")


def test_h200_without_shader_f16_keeps_only_integer_configs():
    props = recorded("nvidia-h200-khr-coopmat.json")
    assert configs(props, shader_f16=False) == [
        Cfg("u8", "u32", 16, 16, 32), Cfg("i8", "i32", 16, 16, 32),
        Cfg("u8", "u32", 16, 8, 32), Cfg("i8", "i32", 16, 8, 32),
    ]
    r = reasons(props, shader_f16=False)
    assert r[0] == ("f16 entry and shader-f16 not requested",)


def test_f16_gate_on_device_without_shader_float16():
    props = [entry(8, 8, 8, CT.FLOAT16), entry(8, 8, 8, CT.SINT8, c=CT.SINT32)]
    assert configs(props, device_f16=False) == [Cfg("i8", "i32", 8, 8, 8)]
    assert reasons(props, device_shader_float16=False)[0] == (
        "f16 entry and the device lacks shaderFloat16",)


def test_saturating_entry_dropped():
    props = [entry(16, 16, 32, CT.SINT8, c=CT.SINT32, sat=True)]
    assert configs(props) == []
    assert reasons(props) == [("saturatingAccumulation is true",)]


def test_a_type_differs_from_b_type():
    props = [entry(16, 16, 32, CT.UINT8, b=CT.SINT8, c=CT.SINT32)]
    assert configs(props) == []
    assert reasons(props) == [("A type UINT8 != B type SINT8",)]


def test_c_type_differs_from_result_type():
    props = [entry(16, 16, 16, CT.FLOAT16, c=CT.FLOAT16, r=CT.FLOAT32)]
    assert configs(props) == []
    assert reasons(props) == [("C type FLOAT16 != Result type FLOAT32",)]


@pytest.mark.parametrize("scope,name", [(Scope.WORKGROUP, "WORKGROUP"), (Scope.DEVICE, "DEVICE"),
                                        (Scope.QUEUE_FAMILY, "QUEUE_FAMILY")])
def test_non_subgroup_scopes_dropped(scope, name):
    props = [entry(16, 16, 16, CT.FLOAT32, scope=scope)]
    assert configs(props) == []
    assert reasons(props) == [(f"scope is {name}, not SUBGROUP",)]


def test_bf16_and_float8_entries_dropped():
    props = [
        entry(16, 16, 16, CT.BFLOAT16, c=CT.FLOAT32),
        entry(16, 16, 32, CT.FLOAT8_E4M3, c=CT.FLOAT32),
        entry(16, 16, 32, CT.FLOAT8_E5M2, c=CT.FLOAT16),
    ]
    assert configs(props) == []
    assert reasons(props) == [
        ("A type BFLOAT16 is not a WebGPU component type",
         "B type BFLOAT16 is not a WebGPU component type"),
        ("A type FLOAT8_E4M3 is not a WebGPU component type",
         "B type FLOAT8_E4M3 is not a WebGPU component type"),
        ("A type FLOAT8_E5M2 is not a WebGPU component type",
         "B type FLOAT8_E5M2 is not a WebGPU component type"),
    ]


def test_unknown_enum_value_kept_as_number():
    props = [entry(8, 8, 8, 4242, c=CT.FLOAT32), entry(8, 8, 8, CT.FLOAT32, scope=77)]
    entries = filter_configs(props, shader_f16=True, device_shader_float16=True)
    assert [e.reasons for e in entries] == [
        ("A type 4242 is not a WebGPU component type",
         "B type 4242 is not a WebGPU component type"),
        ("scope is 77, not SUBGROUP",),
    ]
    assert entries[0].properties.to_dict()["AType"] == 4242
    assert entries[1].properties.to_dict()["scope"] == 77


def test_all_webgpu_types_map():
    props = [entry(8, 8, 8, CT.FLOAT32), entry(8, 8, 8, CT.SINT32), entry(8, 8, 8, CT.UINT32),
             entry(8, 8, 8, CT.UINT8, c=CT.UINT32)]
    assert configs(props) == [Cfg("f32", "f32", 8, 8, 8), Cfg("i32", "i32", 8, 8, 8),
                              Cfg("u32", "u32", 8, 8, 8), Cfg("u8", "u32", 8, 8, 8)]


def test_every_broken_rule_is_reported():
    props = [entry(8, 8, 8, CT.FLOAT16, b=CT.BFLOAT16, c=CT.FLOAT16, r=CT.FLOAT32, sat=True,
                   scope=Scope.WORKGROUP)]
    assert reasons(props, shader_f16=False) == [(
        "A type FLOAT16 != B type BFLOAT16",
        "C type FLOAT16 != Result type FLOAT32",
        "B type BFLOAT16 is not a WebGPU component type",
        "saturatingAccumulation is true",
        "scope is WORKGROUP, not SUBGROUP",
        "f16 entry and shader-f16 not requested",
    )]


def test_feature_available_when_all_requirements_hold():
    s = subgroup_matrix_support(recorded("lavapipe-mesa26-khr-coopmat.json"), ALL_FEATURES, COMPUTE)
    assert s.available and s.unmet == ()
    assert len(s.configs) == 4


def test_empty_list_makes_feature_unavailable():
    s = subgroup_matrix_support([], ALL_FEATURES, COMPUTE)
    assert s.configs == () and s.entries == ()
    assert not s.available
    assert s.unmet == ("subgroupMatrixConfigs is empty",)


def test_only_dropped_entries_make_feature_unavailable():
    s = subgroup_matrix_support([entry(16, 16, 16, CT.BFLOAT16, c=CT.FLOAT32)], ALL_FEATURES,
                                COMPUTE)
    assert s.unmet == ("subgroupMatrixConfigs is empty",)


def test_each_unmet_requirement_named():
    s = subgroup_matrix_support(recorded("lavapipe-mesa26-khr-coopmat.json"),
                                {"shaderFloat16": True}, 0x10)
    assert s.unmet == ("cooperativeMatrix", "cooperativeMatrixSupportedStages lacks COMPUTE",
                       "vulkanMemoryModel", "subgroupSizeControl", "computeFullSubgroups")
    partial = dict(ALL_FEATURES, computeFullSubgroups=False)
    s = subgroup_matrix_support(recorded("lavapipe-mesa26-khr-coopmat.json"), partial, COMPUTE)
    assert s.unmet == ("computeFullSubgroups",)


def test_record_parsing_accepts_full_enum_names():
    p = P.from_record({"M": 16, "N": 8, "K": 16, "A": "VK_COMPONENT_TYPE_FLOAT16_KHR",
                       "B": "FLOAT16", "C": "VK_COMPONENT_TYPE_FLOAT32_NV", "R": 1,
                       "sat": False, "scope": "VK_SCOPE_SUBGROUP_KHR"})
    assert (p.a_type, p.b_type, p.c_type, p.result_type, p.scope) == (0, 0, 1, 1, 3)
