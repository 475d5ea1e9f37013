"""Recording, submitting and timing one GEMM on a device.

One Executor per logical device; it serialises submissions (one command buffer, one
fence, one timestamp pair), which makes concurrent Python threads safe. Each call:
staging uploads -> barrier -> timestamp -> dispatch -> timestamp -> barrier -> download.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from coopmat.device.logical import Device
from coopmat.device.vkffi import vk
from coopmat.dispatch.memory import Buffer
from coopmat.dispatch.pipelines import SHADER_STAGE_COMPUTE, Pipeline
from coopmat.dispatch.vkcall import call, check
from coopmat.errors import VulkanError

STAGE_TRANSFER = 0x1000
STAGE_COMPUTE = 0x800
STAGE_HOST = 0x4000
STAGE_TOP = 0x1
STAGE_BOTTOM = 0x2000
ACCESS_SHADER_READ = 0x20
ACCESS_SHADER_WRITE = 0x40
ACCESS_TRANSFER_READ = 0x800
ACCESS_TRANSFER_WRITE = 0x1000
ACCESS_HOST_READ = 0x2000
ACCESS_HOST_WRITE = 0x4000
QUERY_RESULT_64 = 0x1
QUERY_RESULT_WAIT = 0x2
FENCE_WAIT_SLICE_NS = 100_000_000
FENCE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Copy:
    src: Buffer
    dst: Buffer
    nbytes: int


@dataclass(frozen=True)
class Dispatch:
    pipeline: Pipeline
    buffers: dict[int, Buffer]  # binding -> buffer
    push_constants: bytes
    groups: tuple[int, int, int]


class Executor:
    def __init__(self, device: Device):
        v = vk()
        self.device = device
        self.lock = threading.Lock()
        dev = device.handle
        self._cmd_pool = call(v.vkCreateCommandPool, dev, v.VkCommandPoolCreateInfo(
            flags=v.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
            queueFamilyIndex=device.queue_family_index), None)
        self._cmd = call(v.vkAllocateCommandBuffers, dev, v.VkCommandBufferAllocateInfo(
            commandPool=self._cmd_pool, level=v.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
            commandBufferCount=1))[0]
        self._fence = call(v.vkCreateFence, dev, v.VkFenceCreateInfo(), None)
        self._desc_pool = call(v.vkCreateDescriptorPool, dev, v.VkDescriptorPoolCreateInfo(
            maxSets=4, poolSizeCount=1, pPoolSizes=[v.VkDescriptorPoolSize(
                type=v.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=16)]), None)
        self.timestamps = device.timestamp_valid_bits > 0
        self._queries = call(v.vkCreateQueryPool, dev, v.VkQueryPoolCreateInfo(
            queryType=v.VK_QUERY_TYPE_TIMESTAMP, queryCount=2), None) if self.timestamps else None
        self._period_ns = device.info.limits.timestamp_period
        self._ts_mask = (1 << device.timestamp_valid_bits) - 1 if self.timestamps else 0
        self._max_groups = device.info.limits.max_compute_work_group_count

    def run(self, uploads: Sequence[Copy], dispatches: Sequence[Dispatch],
            downloads: Sequence[Copy]) -> float | None:
        """Run one submission; returns the kernels' GPU time in seconds (None where the
        queue has no timestamps)."""
        v = vk()
        lib, ffi = v.lib, v.ffi
        dev = self.device.handle
        with self.lock:
            call(v.vkResetDescriptorPool, dev, self._desc_pool, 0)
            sets = []
            for d in dispatches:
                s = call(v.vkAllocateDescriptorSets, dev, v.VkDescriptorSetAllocateInfo(
                    descriptorPool=self._desc_pool, descriptorSetCount=1,
                    pSetLayouts=[d.pipeline.set_layout]))[0]
                infos = {b: v.VkDescriptorBufferInfo(buffer=buf.handle, offset=0,
                                                     range=buf.size)
                         for b, buf in d.buffers.items()}
                writes = [v.VkWriteDescriptorSet(
                    dstSet=s, dstBinding=b, descriptorCount=1,
                    descriptorType=v.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, pBufferInfo=[info])
                    for b, info in infos.items()]
                v.vkUpdateDescriptorSets(dev, len(writes), writes, 0, None)
                sets.append(s)

            cmd = self._cmd
            call(v.vkResetCommandBuffer, cmd, 0)
            call(v.vkBeginCommandBuffer, cmd, v.VkCommandBufferBeginInfo(
                flags=v.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
            # Host writes (mapped, coherent) are visible to the device at submit; the
            # barrier below orders the staging copies before the shader reads.
            for c in uploads:
                v.vkCmdCopyBuffer(cmd, c.src.handle, c.dst.handle, 1,
                                  [v.VkBufferCopy(srcOffset=0, dstOffset=0, size=c.nbytes)])
            self._barrier(cmd, STAGE_HOST | STAGE_TRANSFER, STAGE_COMPUTE,
                          ACCESS_HOST_WRITE | ACCESS_TRANSFER_WRITE, ACCESS_SHADER_READ)
            if self._queries is not None:
                v.vkCmdResetQueryPool(cmd, self._queries, 0, 2)
                v.vkCmdWriteTimestamp(cmd, STAGE_TOP, self._queries, 0)
            for i, (d, s) in enumerate(zip(dispatches, sets)):
                if i:
                    self._barrier(cmd, STAGE_COMPUTE, STAGE_COMPUTE,
                                  ACCESS_SHADER_WRITE, ACCESS_SHADER_READ | ACCESS_SHADER_WRITE)
                self._dispatch(cmd, d, s)
            if self._queries is not None:
                v.vkCmdWriteTimestamp(cmd, STAGE_BOTTOM, self._queries, 1)
            self._barrier(cmd, STAGE_COMPUTE, STAGE_TRANSFER | STAGE_HOST,
                          ACCESS_SHADER_WRITE, ACCESS_TRANSFER_READ | ACCESS_HOST_READ)
            for c in downloads:
                v.vkCmdCopyBuffer(cmd, c.src.handle, c.dst.handle, 1,
                                  [v.VkBufferCopy(srcOffset=0, dstOffset=0, size=c.nbytes)])
            if downloads:
                self._barrier(cmd, STAGE_TRANSFER, STAGE_HOST, ACCESS_TRANSFER_WRITE,
                              ACCESS_HOST_READ)
            call(v.vkEndCommandBuffer, cmd)

            submit = v.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cmd])
            with self.device.queue_lock:
                call(v.vkQueueSubmit, self.device.queue, 1, [submit], self._fence)
            self._wait()
            call(v.vkResetFences, dev, 1, [self._fence])
            if self._queries is None:
                return None
            data = ffi.new("uint64_t[2]")
            check("vkGetQueryPoolResults", lib.vkGetQueryPoolResults(
                dev, self._queries, 0, 2, 16, data, 8, QUERY_RESULT_64 | QUERY_RESULT_WAIT))
            ticks = ((data[1] - data[0]) & self._ts_mask)
            return ticks * self._period_ns * 1e-9

    def _wait(self) -> None:
        v = vk()
        fences = v.ffi.new("VkFence[1]", [self._fence])
        waited = 0.0
        while True:
            r = v.lib.vkWaitForFences(self.device.handle, 1, fences, 1, FENCE_WAIT_SLICE_NS)
            if r == v.VK_SUCCESS:
                return
            if r != v.VK_TIMEOUT:
                check("vkWaitForFences", r)
            waited += FENCE_WAIT_SLICE_NS * 1e-9
            if waited > FENCE_TIMEOUT_S:
                raise VulkanError("vkWaitForFences", f"VK_TIMEOUT after {FENCE_TIMEOUT_S:.0f} s")

    def _barrier(self, cmd: Any, src_stage: int, dst_stage: int, src: int, dst: int) -> None:
        v = vk()
        v.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1,
                               [v.VkMemoryBarrier(srcAccessMask=src, dstAccessMask=dst)],
                               0, None, 0, None)

    def _dispatch(self, cmd: Any, d: Dispatch, s: Any) -> None:
        v = vk()
        p = d.pipeline
        v.vkCmdBindPipeline(cmd, v.VK_PIPELINE_BIND_POINT_COMPUTE, p.handle)
        v.vkCmdBindDescriptorSets(cmd, v.VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0, 1, [s],
                                  0, None)
        pc = v.ffi.from_buffer(d.push_constants)
        v.lib.vkCmdPushConstants(cmd, p.layout, SHADER_STAGE_COMPUTE, 0, len(d.push_constants), pc)
        gx, gy, gz = d.groups
        mx, my, mz = self._max_groups
        if gx > mx or gy > my:
            raise ValueError(f"problem needs {gx}x{gy} workgroups, the device allows {mx}x{my}")
        # Large batches: split z, relying on the DISPATCH_BASE pipeline flag so the
        # shader's WorkgroupId still counts from the true batch index.
        for z0 in range(0, gz, mz):
            v.lib.vkCmdDispatchBase(cmd, 0, 0, z0, gx, gy, min(mz, gz - z0))

    def destroy(self) -> None:
        v = vk()
        dev = self.device.handle
        if self._queries is not None:
            v.vkDestroyQueryPool(dev, self._queries, None)
        v.vkDestroyDescriptorPool(dev, self._desc_pool, None)
        v.vkDestroyFence(dev, self._fence, None)
        v.vkDestroyCommandPool(dev, self._cmd_pool, None)
