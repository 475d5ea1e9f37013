"""Compute pipelines for generated kernels, cached in memory and, through a
VkPipelineCache, on disk so a new process skips the driver's shader compile."""

from __future__ import annotations

import atexit
import os
import threading
from dataclasses import dataclass
from typing import Any

from coopmat.common.cachedir import cache_root
from coopmat.common.errors import MissingFeatureError
from coopmat.device.logical import Device
from coopmat.device.vkffi import vk
from coopmat.dispatch.vkcall import call, check

SHADER_STAGE_COMPUTE = 0x20
# VK_PIPELINE_SHADER_STAGE_CREATE_*: the WebGPU proposal's Vulkan mapping.
ALLOW_VARYING_SUBGROUP_SIZE = 0x1
REQUIRE_FULL_SUBGROUPS = 0x2
PIPELINE_CREATE_DISPATCH_BASE = 0x10
PIPELINE_CREATE_CAPTURE_STATISTICS = 0x40  # VK_KHR_pipeline_executable_properties
STATS_ENV = "COOPMAT_PIPELINE_STATS"
STRUCTURE_TYPE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO = 1000225001


@dataclass
class Pipeline:
    kernel: Any
    handle: Any
    layout: Any
    set_layout: Any
    module: Any
    addr: int = 0  # the VkPipeline handle as an int, a cheap cache key


class PipelineCache:
    """Pipelines of one device, keyed by kernel binary."""

    def __init__(self, device: Device):
        self.device = device
        self._lock = threading.Lock()
        self._pipelines: dict[Any, Pipeline] = {}
        self._dirty = False
        # The driver's compiler statistics (registers, spills, ...) are captured only on
        # request: capturing may cost compile time, and they are a tuning aid.
        self.capture_statistics = bool(os.environ.get(STATS_ENV)) and device.has(
            "pipelineExecutableInfo")
        v = vk()
        props = v.vkGetPhysicalDeviceProperties(device.physical)
        uuid = bytes(v.ffi.buffer(props.pipelineCacheUUID, 16)).hex()
        name = f"{props.vendorID:04x}-{props.deviceID:04x}-{uuid}.bin"
        root = cache_root()
        self.path = root / "pipelines" / name if root is not None else None
        initial = b""
        try:
            initial = self.path.read_bytes() if self.path is not None else b""
        except OSError:
            pass
        data = v.ffi.new("char[]", initial) if initial else None
        try:
            self.handle = call(v.vkCreatePipelineCache, device.handle, v.VkPipelineCacheCreateInfo(
                initialDataSize=len(initial), pInitialData=data), None)
        except Exception:  # a stale or corrupt file: start empty
            self.handle = call(v.vkCreatePipelineCache, device.handle,
                               v.VkPipelineCacheCreateInfo(), None)
        atexit.register(self.save)

    def get(self, kernel: Any) -> Pipeline:
        key = kernel.traits
        with self._lock:
            p = self._pipelines.get(key)
            if p is None:
                p = self._create(kernel)
                self._pipelines[key] = p
                self._dirty = True
            return p

    def _create(self, kernel: Any) -> Pipeline:
        v = vk()
        dev = self.device.handle
        limits = self.device.info.limits
        if kernel.shared_memory_bytes > limits.max_compute_shared_memory_size:
            raise MissingFeatureError(
                f"kernel needs {kernel.shared_memory_bytes} bytes of shared memory, the device "
                f"offers {limits.max_compute_shared_memory_size}")
        module = call(v.vkCreateShaderModule, dev, v.VkShaderModuleCreateInfo(
            codeSize=len(kernel.spirv), pCode=kernel.spirv), None)
        bindings = [v.VkDescriptorSetLayoutBinding(
            binding=b, descriptorType=v.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1,
            stageFlags=SHADER_STAGE_COMPUTE) for b in kernel.bindings]
        set_layout = call(v.vkCreateDescriptorSetLayout, dev, v.VkDescriptorSetLayoutCreateInfo(
            bindingCount=len(bindings), pBindings=bindings), None)
        ranges = [v.VkPushConstantRange(stageFlags=SHADER_STAGE_COMPUTE, offset=0,
                                        size=kernel.push_constant_size)]
        layout = call(v.vkCreatePipelineLayout, dev, v.VkPipelineLayoutCreateInfo(
            setLayoutCount=1, pSetLayouts=[set_layout], pushConstantRangeCount=1,
            pPushConstantRanges=ranges), None)

        flags = REQUIRE_FULL_SUBGROUPS
        next_ = None
        size = kernel.required_subgroup_size
        if size is not None and limits.min_subgroup_size != limits.max_subgroup_size:
            if not limits.required_subgroup_size_stages & SHADER_STAGE_COMPUTE:
                raise MissingFeatureError(
                    "kernel needs a fixed subgroup size and the device cannot require one "
                    "for compute shaders")
            if not limits.min_subgroup_size <= size <= limits.max_subgroup_size:
                raise MissingFeatureError(
                    f"kernel needs subgroup size {size}, the device offers "
                    f"{limits.min_subgroup_size}..{limits.max_subgroup_size}")
            next_ = v.VkPipelineShaderStageRequiredSubgroupSizeCreateInfo(
                sType=STRUCTURE_TYPE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO,
                requiredSubgroupSize=size)
        else:
            # Without a required size the spec lets the size vary only with this flag
            # (and the x size must then be a multiple of maxSubgroupSize).
            flags |= ALLOW_VARYING_SUBGROUP_SIZE
            if kernel.local_size[0] % limits.max_subgroup_size:
                raise MissingFeatureError(
                    f"workgroup x size {kernel.local_size[0]} is not a multiple of "
                    f"maxSubgroupSize {limits.max_subgroup_size}")
        stage = v.VkPipelineShaderStageCreateInfo(
            pNext=next_, flags=flags, stage=SHADER_STAGE_COMPUTE, module=module, pName="main")
        create_flags = PIPELINE_CREATE_DISPATCH_BASE
        if self.capture_statistics:
            create_flags |= PIPELINE_CREATE_CAPTURE_STATISTICS
        robustness = None
        # Kernels whose traits say they stay inside their bindings run without the
        # driver's bounds checks on storage buffers, where the device lets a pipeline ask.
        # The others ask for the checks by name: with pipelineRobustness enabled, NVIDIA's
        # default for a pipeline that names none is no checks, and the bounds-checked
        # variants ran 1.25-3x slower without them on the H200.
        if self.device.has("pipelineRobustness"):
            unchecked = not getattr(kernel.traits, "storage_checks", True)
            default = v.VK_PIPELINE_ROBUSTNESS_BUFFER_BEHAVIOR_DEVICE_DEFAULT_EXT
            robustness = v.VkPipelineRobustnessCreateInfoEXT(
                sType=v.VK_STRUCTURE_TYPE_PIPELINE_ROBUSTNESS_CREATE_INFO_EXT,
                storageBuffers=v.VK_PIPELINE_ROBUSTNESS_BUFFER_BEHAVIOR_DISABLED_EXT
                if unchecked else v.VK_PIPELINE_ROBUSTNESS_BUFFER_BEHAVIOR_ROBUST_BUFFER_ACCESS_EXT,
                uniformBuffers=default, vertexInputs=default,
                images=v.VK_PIPELINE_ROBUSTNESS_IMAGE_BEHAVIOR_DEVICE_DEFAULT_EXT)
        info = v.VkComputePipelineCreateInfo(
            pNext=robustness, flags=create_flags, stage=stage, layout=layout,
            basePipelineIndex=-1)
        handle = call(v.vkCreateComputePipelines, dev, self.handle, 1, [info], None)[0]
        return Pipeline(kernel, handle, layout, set_layout, module,
                        int(v.ffi.cast("uintptr_t", handle)))

    def statistics(self, pipeline: Pipeline) -> dict[str, int | float | bool]:
        """The driver's statistics of the pipeline's compute executable (names as the
        driver gives them, e.g. a register count); empty unless capture_statistics."""
        if not self.capture_statistics:
            return {}
        v = vk()
        dev = self.device.handle
        fn = v.lib.vkGetDeviceProcAddr(dev, b"vkGetPipelineExecutableStatisticsKHR")
        if fn == v.ffi.NULL:
            return {}
        get = v.ffi.cast("PFN_vkGetPipelineExecutableStatisticsKHR", fn)
        info = v.ffi.new("VkPipelineExecutableInfoKHR *")
        info.sType = v.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR
        info.pipeline = pipeline.handle
        info.executableIndex = 0
        count = v.ffi.new("uint32_t *")
        check("vkGetPipelineExecutableStatisticsKHR", get(dev, info, count, v.ffi.NULL))
        stats = v.ffi.new("VkPipelineExecutableStatisticKHR[]", count[0])
        for st in stats:  # the binding's wrapper leaves sType unset; the spec wants it
            st.sType = v.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR
        check("vkGetPipelineExecutableStatisticsKHR", get(dev, info, count, stats))
        out: dict[str, int | float | bool] = {}
        for st in stats[0:count[0]]:
            name = v.ffi.string(st.name).decode()
            fmt = st.format  # VkPipelineExecutableStatisticFormatKHR: bool32, i64, u64, f64
            out[name] = (bool(st.value.b32), int(st.value.i64), int(st.value.u64),
                         float(st.value.f64))[fmt]
        return out

    def destroy(self) -> None:
        """Save the cache blob, then destroy every pipeline object and the cache itself
        (all of them must go before their device does)."""
        self.save()
        atexit.unregister(self.save)
        if self.device.handle is None:
            return
        v = vk()
        dev = self.device.handle
        with self._lock:
            for p in self._pipelines.values():
                v.vkDestroyPipeline(dev, p.handle, None)
                v.vkDestroyPipelineLayout(dev, p.layout, None)
                v.vkDestroyDescriptorSetLayout(dev, p.set_layout, None)
                v.vkDestroyShaderModule(dev, p.module, None)
            self._pipelines.clear()
            if self.handle is not None:
                v.vkDestroyPipelineCache(dev, self.handle, None)
                self.handle = None

    def save(self) -> None:
        """Write the driver's cache blob to disk (atomically), if anything new was built."""
        if (not self._dirty or self.device.handle is None or self.handle is None
                or self.path is None):
            return
        v = vk()
        with self._lock:
            size = v.ffi.new("size_t *")
            check("vkGetPipelineCacheData",
                  v.lib.vkGetPipelineCacheData(self.device.handle, self.handle, size, v.ffi.NULL))
            buf = v.ffi.new("char[]", size[0])
            check("vkGetPipelineCacheData",
                  v.lib.vkGetPipelineCacheData(self.device.handle, self.handle, size, buf))
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_bytes(bytes(v.ffi.buffer(buf, size[0])))
                tmp.replace(self.path)
                self._dirty = False
            except OSError:
                pass  # a read-only cache directory only costs compile time
