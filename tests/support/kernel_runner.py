"""A minimal, test-only dispatcher for generated GEMM kernels, on the `vulkan` binding.

One instance, the first device with VK_KHR_cooperative_matrix, a logical device with the
features the kernels declare, host-visible buffers, one dispatch per call. The library's
real dispatcher supersedes it; this exists so codegen tests can run kernels on lavapipe.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from coopmat.codegen import GemmParams, Kernel

COOPMAT_EXT = "VK_KHR_cooperative_matrix"
# VkPipelineShaderStageCreateFlagBits
REQUIRE_FULL_SUBGROUPS = 0x2

# Where each feature the kernels may need lives in the VkPhysicalDevice*Features chain.
_FEATURE_STRUCT = {
    "shaderInt16": "core",
    "storageBuffer16BitAccess": "v11",
    "shaderFloat16": "v12",
    "shaderInt8": "v12",
    "storageBuffer8BitAccess": "v12",
    "vulkanMemoryModel": "v12",
    "subgroupSizeControl": "v13",
    "computeFullSubgroups": "v13",
    "maintenance4": "v13",  # LocalSizeId, as glslang emits for local_size_x_id
    "cooperativeMatrix": "coop",
}
BASE_FEATURES = ("cooperativeMatrix", "vulkanMemoryModel", "subgroupSizeControl",
                 "computeFullSubgroups")


class NoDevice(RuntimeError):
    """No Vulkan device with VK_KHR_cooperative_matrix (tests skip on it)."""


def _vk() -> Any:
    try:
        import vulkan
    except (ImportError, OSError) as e:  # OSError: the binding found no libvulkan
        raise NoDevice(f"the vulkan binding is unavailable: {e}") from e
    return vulkan


def _chain(vk: Any, values: dict[str, bool]) -> tuple[Any, list[Any]]:
    """A VkPhysicalDeviceFeatures2 chain with `values` set; also returns what keeps it alive."""
    def pick(group: str) -> dict[str, bool]:
        return {k: v for k, v in values.items() if _FEATURE_STRUCT.get(k) == group}
    coop = vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(**pick("coop"))
    v13 = vk.VkPhysicalDeviceVulkan13Features(pNext=coop, **pick("v13"))
    v12 = vk.VkPhysicalDeviceVulkan12Features(pNext=v13, **pick("v12"))
    v11 = vk.VkPhysicalDeviceVulkan11Features(pNext=v12, **pick("v11"))
    core = vk.VkPhysicalDeviceFeatures(**pick("core"))
    head = vk.VkPhysicalDeviceFeatures2(pNext=v11, features=core)
    return head, [coop, v13, v12, v11, core]


class KernelRunner:
    def __init__(self, features: Iterable[str] = (), instance: Any = None) -> None:
        """`instance`: a VkInstance to use (e.g. coopmat's own, which has the validation
        layer under COOPMAT_VALIDATION=1) instead of a private one without layers."""
        vk = self.vk = _vk()
        app = vk.VkApplicationInfo(pApplicationName="coopmat-tests", apiVersion=(1 << 22) | (
            3 << 12))
        try:
            self.instance = instance if instance is not None else vk.vkCreateInstance(
                vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
            physical = vk.vkEnumeratePhysicalDevices(self.instance)
        except Exception as e:  # the loader raises its own error classes
            raise NoDevice(f"no Vulkan instance: {e}") from e
        for pd in physical:
            exts = {e.extensionName for e in
                    vk.vkEnumerateDeviceExtensionProperties(pd, None)}
            if COOPMAT_EXT in exts:
                self.physical = pd
                break
        else:
            raise NoDevice(f"no device offers {COOPMAT_EXT}")
        self.name = vk.vkGetPhysicalDeviceProperties(self.physical).deviceName
        self.supported = self._supported_features()
        want = set(BASE_FEATURES) | set(features)
        self.features = frozenset(f for f in want if self.supported.get(f))
        self._create_device()
        self._pipelines: dict[tuple[bytes, tuple[tuple[int, int], ...]], tuple[Any, ...]] = {}

    # -- setup ----------------------------------------------------------------------------
    def _supported_features(self) -> dict[str, bool]:
        vk = self.vk
        head, keep = _chain(vk, {})
        vk.vkGetPhysicalDeviceFeatures2(self.physical, head)
        coop, v13, v12, v11, _ = keep
        structs = {"core": head.features, "v11": v11, "v12": v12, "v13": v13, "coop": coop}
        return {name: bool(getattr(structs[group], name))
                for name, group in _FEATURE_STRUCT.items()}

    def _create_device(self) -> None:
        vk = self.vk
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        self.family = next(i for i, f in enumerate(families)
                           if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT)
        head, self._keep = _chain(vk, {f: True for f in self.features})
        queue = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.family, queueCount=1,
                                           pQueuePriorities=[1.0])
        info = vk.VkDeviceCreateInfo(pNext=head, pQueueCreateInfos=[queue],
                                     ppEnabledExtensionNames=[COOPMAT_EXT])
        self.device = vk.vkCreateDevice(self.physical, info, None)
        self.queue = vk.vkGetDeviceQueue(self.device, self.family, 0)
        self.pool = vk.vkCreateCommandPool(self.device, vk.VkCommandPoolCreateInfo(
            queueFamilyIndex=self.family), None)
        self.memory_props = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)

    def can_run(self, kernel: Kernel) -> bool:
        return set(kernel.features) <= self.features

    # -- resources ------------------------------------------------------------------------
    def _memory_type(self, bits: int) -> int:
        vk = self.vk
        want = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        for i in range(self.memory_props.memoryTypeCount):
            if bits & (1 << i) and (self.memory_props.memoryTypes[i].propertyFlags & want) == want:
                return i
        raise RuntimeError("no host-visible coherent memory")

    def _buffer(self, nbytes: int) -> tuple[Any, Any, int]:
        """A storage buffer of exactly nbytes rounded up to 4 (as a caller would allocate)."""
        vk = self.vk
        size = max(4, -(-nbytes // 4) * 4)
        buf = vk.vkCreateBuffer(self.device, vk.VkBufferCreateInfo(
            size=size, usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        req = vk.vkGetBufferMemoryRequirements(self.device, buf)
        mem = vk.vkAllocateMemory(self.device, vk.VkMemoryAllocateInfo(
            allocationSize=req.size, memoryTypeIndex=self._memory_type(req.memoryTypeBits)),
            None)
        vk.vkBindBufferMemory(self.device, buf, mem, 0)
        return buf, mem, size

    def _pipeline(self, kernel: Kernel, specialization: Mapping[int, int]) -> tuple[Any, ...]:
        key = (kernel.spirv, tuple(sorted(specialization.items())))
        cached = self._pipelines.get(key)
        if cached:
            return cached
        vk, dev = self.vk, self.device
        bindings = [vk.VkDescriptorSetLayoutBinding(
            binding=b, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1,
            stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for b in kernel.bindings]
        set_layout = vk.vkCreateDescriptorSetLayout(
            dev, vk.VkDescriptorSetLayoutCreateInfo(pBindings=bindings), None)
        push = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0,
                                      size=kernel.push_constant_size)
        layout = vk.vkCreatePipelineLayout(dev, vk.VkPipelineLayoutCreateInfo(
            pSetLayouts=[set_layout], pPushConstantRanges=[push]), None)
        module = vk.vkCreateShaderModule(dev, vk.VkShaderModuleCreateInfo(
            codeSize=len(kernel.spirv), pCode=kernel.spirv), None)
        size_info = None
        if kernel.required_subgroup_size:
            size_info = vk.VkPipelineShaderStageRequiredSubgroupSizeCreateInfo(
                requiredSubgroupSize=kernel.required_subgroup_size)
        spec_info = None
        if specialization:  # every value 4 bytes (uint32, or VkBool32 for a bool)
            ids = sorted(specialization)
            data = struct.pack(f"<{len(ids)}I", *(specialization[i] for i in ids))
            spec_data = vk.ffi.new("char[]", data)  # alive until the pipeline exists
            spec_info = vk.VkSpecializationInfo(
                pMapEntries=[vk.VkSpecializationMapEntry(constantID=c, offset=4 * n, size=4)
                             for n, c in enumerate(ids)],
                dataSize=len(data), pData=spec_data)
        stage = vk.VkPipelineShaderStageCreateInfo(
            pNext=size_info, flags=REQUIRE_FULL_SUBGROUPS,
            stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName="main",
            pSpecializationInfo=spec_info)
        pipeline = vk.vkCreateComputePipelines(dev, None, 1, [vk.VkComputePipelineCreateInfo(
            stage=stage, layout=layout)], None)[0]
        vk.vkDestroyShaderModule(dev, module, None)
        entry = (pipeline, layout, set_layout)
        self._pipelines[key] = entry
        return entry

    # -- one dispatch ---------------------------------------------------------------------
    def run(self, kernel: Kernel, params: GemmParams, buffers: dict[int, np.ndarray],
            batch: int = 1, specialization: Mapping[int, int] | None = None) -> bytes:
        """Dispatch once; `buffers` maps binding -> contents; returns binding 2's bytes.
        `specialization` maps constant_id -> value for the module's specialization
        constants (generated kernels have none)."""
        vk, dev = self.vk, self.device
        if not self.can_run(kernel):
            raise NoDevice(f"device lacks {set(kernel.features) - self.features}")
        pipeline, layout, set_layout = self._pipeline(kernel, specialization or {})
        made = {}
        for b in kernel.bindings:
            data = np.ascontiguousarray(buffers[b]).tobytes()
            buf, mem, size = self._buffer(len(data))
            view = vk.vkMapMemory(dev, mem, 0, size, 0)
            view[:len(data)] = data
            vk.vkUnmapMemory(dev, mem)
            made[b] = (buf, mem, size)
        pool = vk.vkCreateDescriptorPool(dev, vk.VkDescriptorPoolCreateInfo(
            maxSets=1, pPoolSizes=[vk.VkDescriptorPoolSize(
                type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=len(made))]), None)
        dset = vk.vkAllocateDescriptorSets(dev, vk.VkDescriptorSetAllocateInfo(
            descriptorPool=pool, pSetLayouts=[set_layout]))[0]
        writes = [vk.VkWriteDescriptorSet(
            dstSet=dset, dstBinding=b, descriptorCount=1,
            descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=buf, offset=0, range=size)])
            for b, (buf, _, size) in made.items()]
        vk.vkUpdateDescriptorSets(dev, len(writes), writes, 0, None)
        cmd = vk.vkAllocateCommandBuffers(dev, vk.VkCommandBufferAllocateInfo(
            commandPool=self.pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
            commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
            flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline)
        vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 1,
                                   [dset], 0, None)
        pc = kernel.push_constants(params)
        vk.vkCmdPushConstants(cmd, layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(pc),
                              vk.ffi.new("char[]", pc))
        vk.vkCmdDispatch(cmd, *kernel.workgroups(params.M, params.N, batch))
        vk.vkEndCommandBuffer(cmd)
        fence = vk.vkCreateFence(dev, vk.VkFenceCreateInfo(), None)
        vk.vkQueueSubmit(self.queue, 1, [vk.VkSubmitInfo(pCommandBuffers=[cmd])], fence)
        # lavapipe compiles the kernel here, in its queue's thread: minutes for the largest
        # tiles on a loaded machine.
        vk.vkWaitForFences(dev, 1, [fence], vk.VK_TRUE, 900 * 10**9)
        _, mem, size = made[2]
        out = bytes(vk.vkMapMemory(dev, mem, 0, size, 0))
        vk.vkUnmapMemory(dev, mem)
        vk.vkDestroyFence(dev, fence, None)
        vk.vkFreeCommandBuffers(dev, self.pool, 1, [cmd])
        vk.vkDestroyDescriptorPool(dev, pool, None)
        for buf, mem, _ in made.values():
            vk.vkDestroyBuffer(dev, buf, None)
            vk.vkFreeMemory(dev, mem, None)
        return out


# -- packing numpy operands the way the ABI lays them out ------------------------------------
def pack(mats: np.ndarray, column_major: bool, ld: int, batch_stride: int,
         fill: float | int) -> np.ndarray:
    """Flatten a (batch, rows, cols) stack: element (b, i, j) at b*batch_stride + i*ld + j
    (row-major) or b*batch_stride + j*ld + i (column-major); gaps hold `fill`."""
    batch, rows, cols = mats.shape
    lines, inner = (cols, rows) if column_major else (rows, cols)
    size = (batch - 1) * batch_stride + (lines - 1) * ld + inner
    flat = np.full(size, fill, dtype=mats.dtype)
    for b in range(batch if batch_stride else 1):
        src = mats[b].T if column_major else mats[b]
        for line in range(lines):
            start = b * batch_stride + line * ld
            flat[start:start + inner] = src[line]
    return flat


def unpack(flat: np.ndarray, batch: int, rows: int, cols: int, ld: int,
           batch_stride: int) -> np.ndarray:
    out = np.empty((batch, rows, cols), dtype=flat.dtype)
    for b in range(batch):
        for i in range(rows):
            start = b * batch_stride + i * ld
            out[b, i] = flat[start:start + cols]
    return out


def param_id(v: object) -> str:
    """A short pytest id for component types, layouts and tuples of them."""
    from coopmat.codegen import Layout
    from coopmat.common.enums import ComponentType

    if isinstance(v, ComponentType):
        return v.name.lower()
    if isinstance(v, Layout):
        return "r" if v == Layout.ROW_MAJOR else "c"
    if isinstance(v, tuple):
        return "".join(param_id(x) for x in v)
    return str(v)
