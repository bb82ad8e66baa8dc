// libFuzzer target for the safetensors header parser and the strategy-file reader: any
// bytes must give a header consistent with the file, or an io_error, never a crash, a hang
// or a huge allocation. Built with clang's -fsanitize=fuzzer,address,undefined when clang is
// available (tests/CMakeLists.txt), and run for a bounded time by ctest.
#include <xshard/io/safetensors.hpp>
#include <xshard/io/strategy_file.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    try {
        const auto h = xshard::parse_header(bytes, size);
        for (const auto& t : h.tensors)
            if (t.begin > t.end || t.end > size - h.data_start ||
                t.end - t.begin != t.elements() * xshard::dtype_size(t.dtype))
                __builtin_trap(); // a header that does not fit the file got through
        if (const auto it = h.metadata.find("xshard.strategy"); it != h.metadata.end())
            xshard::strategy_file::from_json(it->second);
    } catch (const xshard::io_error&) {
    }
    try {
        xshard::strategy_file::from_json(bytes);
    } catch (const xshard::io_error&) {
    }
    return 0;
}
