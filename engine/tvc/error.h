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
#include <string_view>
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

// Text that comes from a file or from the user (tensor names, metadata, pickled strings, zip
// entry names, class folder names, file paths), made safe to print to a terminal, where a crafted
// name could otherwise set the title, change the colours or clear the screen. Valid printable
// UTF-8 stays as it is ("café", "层"); each byte of a control character and each byte that is not
// part of valid UTF-8 becomes \xNN (two lowercase hex digits):
//   - the C0 controls 0x00-0x1f, newline and tab included (a name is one line, and a tab would
//     misalign the tables that print names), and DEL 0x7f;
//   - the C1 controls U+0080-U+009F (UTF-8 0xc2 0x80-0x9f: both bytes), which terminals may take
//     for the start of an escape sequence (U+009B is CSI);
//   - stray continuation bytes, overlong forms, surrogates, code points past U+10FFFF, and
//     sequences cut short.
// A backslash becomes \\, so that the escaped text reads back unambiguously. A message applies it
// to each such piece as it puts the piece in, once (escaping twice would double the backslashes),
// never to the whole message, whose own line breaks must stay.
std::string printable(std::string_view text);

// The length of the valid UTF-8 character that starts at text[at] (1 to 4 bytes), or 0 where the
// bytes there are none (a stray continuation byte, an overlong form, a surrogate, a code point
// past U+10FFFF, a sequence cut short by the end of text).
size_t utf8_char_length(std::string_view text, size_t at);

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& first, const Rest&... rest) {
  if constexpr (std::is_convertible_v<const T*, const std::vector<int64_t>*>)  // also tvc::Shape
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
#define TVC_CHECK(cond, ...)                                      \
  do {                                                            \
    if (!(cond)) throw ::tvc::Error(::tvc::cat_str(__VA_ARGS__)); \
  } while (0)
