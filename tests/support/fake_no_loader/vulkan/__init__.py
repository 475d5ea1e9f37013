# Stands in for the `vulkan` binding on a machine without libvulkan.so.1: the real
# binding raises this same OSError at import when its dlopen fails.
raise OSError("Cannot find Vulkan SDK version. Please ensure that it is installed and that "
              "the <sdk_root>/<version>/lib/ folder is in the library path")
