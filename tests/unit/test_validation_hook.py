"""The validation run is only worth something if the hook really sees errors."""

from __future__ import annotations

import pytest


def test_validation_errors_are_caught(live_device_info):
    from coopmat import device
    from coopmat.device import instance
    from coopmat.device.vkffi import vk

    if not instance.validation_requested():
        pytest.skip("runs under COOPMAT_VALIDATION=1 (the suite's validation pass)")
    v = vk()
    dev = device.open_device()
    before = len(instance.validation_errors)
    # size 0 breaks VUID-VkBufferCreateInfo-size-00912; the layer reports it.
    try:
        buf = v.vkCreateBuffer(dev.handle, v.VkBufferCreateInfo(
            size=0, usage=0x20, sharingMode=v.VK_SHARING_MODE_EXCLUSIVE), None)
        v.vkDestroyBuffer(dev.handle, buf, None)
    except v.VkError:
        pass
    caught = instance.validation_errors[before:]
    del instance.validation_errors[before:]  # expected: not this test's failure
    assert any("00912" in m or "size" in m for m in caught), caught
