// tvc::Error and the checks that raise it.
//
// Every public entry point reports bad input by throwing tvc::Error whose message names the op,
// the argument at fault and the shapes involved, e.g.
//   "add: shapes [2, 3] and [4] cannot be broadcast together".
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace tvc {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Printing of shapes as PyTorch does: [2, 3, 4].
std::string shape_str(const std::vector<int64_t>& shape);

// For "did you mean" messages: the Levenshtein distance of two names, and the (at most) count
// candidates nearest to name, nearest first (ties in the candidates' order).
size_t edit_distance(const std::string& a, const std::string& b);
std::vector<std::string> nearest_names(const std::string& name, const std::vector<std::string>& candidates,
                                       size_t count);

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& first, const Rest&... rest) {
  if constexpr (std::is_same_v<T, std::vector<int64_t>>)
    os << shape_str(first);
  else
    os << first;
  append(os, rest...);
}
}  // namespace detail

// Concatenates the arguments into a string; vectors of int64 print as shapes.
template <typename... Args>
std::string cat_str(const Args&... args) {
  std::ostringstream os;
  detail::append(os, args...);
  return os.str();
}

}  // namespace tvc

// Throws tvc::Error built from the message parts when cond is false.
#define TVC_CHECK(cond, ...)                              \
  do {                                                    \
    if (!(cond)) throw ::tvc::Error(::tvc::cat_str(__VA_ARGS__)); \
  } while (0)
