"""Words that change what a maths answer says, in the languages of maths data.

The answer rules (`rl_lm.rewards.answers`) refuse an answer whose span, or the words around it, negate it ("not
18"), hedge it ("maybe"), bound it ("at least"), retract it ("jk") or correct it ("update: 19"). This module holds
that vocabulary: English and the common languages of maths data (Chinese, Spanish, French, German, Russian,
Japanese, Portuguese, Arabic, Hindi, Korean, Italian, Vietnamese, Turkish, and a few words of Indonesian, Dutch,
Polish and Thai), plus common ASCII spellings of the non-Latin ones ("nahi", "degil", "khong").

Spaced scripts are matched word by word (lower case, NFKC as `answer_text.normalise` leaves the text), with a few
two-word phrases ("tal vez", "au moins", "ít nhất"). Scripts written without spaces (Chinese, Japanese, Korean
morphemes, Thai) are matched by substring (`unspaced_signal`): a run of such text is one token, so "答案不是"
("the answer is not") is read by its "不".

The lists cannot be complete; they are not the only defence. An answer span with letters of a non-ASCII script
that these words do not explain is refused anyway (`answers.interpret`, "unreadable"), since a fair GSM8K answer
never needs them, and a word mixing scripts ("nоt" with a Cyrillic "о") is unreadable wherever it is read.

"near" sets count inside an answer span and in the words leading into it; elsewhere they are ordinary prose.
"""
from __future__ import annotations

import unicodedata


def _words(s: str) -> frozenset[str]:
  return frozenset(unicodedata.normalize("NFKC", w).lower() for w in s.split())


NEGATION = _words(
  # English
  "not no never nope nah cannot wrong wrongly incorrect incorrectly untrue invalid false falsely mistake mistaken "
  "erroneous bogus error impossible miscalculated miscounted "
  # German, French, Spanish, Portuguese, Italian
  "nicht nein kein keine keinen keinem keiner niemals nie falsch "
  "pas non jamais faux fausse erroné erronée inexact inexacte "
  "nunca jamás incorrecto incorrecta falsa erróneo errónea equivocado equivocada "
  "não nao errado errada incorreto incorreta "
  "mai sbagliato sbagliata sbagliati errato errata "
  # Russian, Turkish, Vietnamese, Hindi (and romanised), Arabic, Korean (spaced words), Indonesian, Dutch, Polish
  "не нет ни никогда неверно неверный неверная неправильно неправильный неправильная ошибочно ложь "
  "değil degil yok hayır hayir yanlış yanlis hatalı hatali "
  "không khong chẳng chả chưa sai "
  "नहीं नही न ना मत गलत ग़लत "
  "nahi nahin nahee galat "
  "لا ليس ليست لست لم لن غير خطأ خاطئ خاطئة "
  "안 아니 아니다 아니요 아닙니다 아니에요 "
  "tidak bukan salah niet geen nie fałsz błędnie"
)
NEGATION_NEAR = _words(
  "but none neither nor without except excluding besides unlike instead rather different "
  "aber sondern ausser außer mais sauf sinon pero salvo excepto sino ma tranne invece mas exceto senão "
  "но кроме ama fakat hariç nhưng ngoài लेकिन परंतु سوى إلا لكن ni"
)
HEDGE = _words(
  # English
  "or either maybe perhaps probably possibly presumably approximately approx approximate roughly circa unsure "
  "uncertain guess guessing estimate estimated ballpark ish "
  # German, French, Spanish, Portuguese, Italian
  "oder vielleicht wahrscheinlich möglicherweise eventuell etwa ungefähr ungefaehr zirka schätzungsweise "
  "environ peut-être peut-etre probablement approximativement "
  "quizás quizas quizá quiza acaso probablemente posiblemente aproximadamente aproximado "
  "talvez provavelmente possivelmente aproximado "
  "oppure forse probabilmente circa approssimativamente "
  # Russian, Turkish, Vietnamese, Hindi (and romanised), Arabic, Korean, Indonesian, Dutch, Polish
  "или либо возможно наверное наверно вероятно примерно приблизительно около почти порядка "
  "veya veyahut yahut belki muhtemelen yaklaşık yaklasik takriben civarı civari civarında "
  "hoặc hoac khoảng khoang chừng "
  "शायद लगभग करीब क़रीब तकरीबन अथवा "
  "shayad lagbhag "
  "أو ربما لعل تقريبا تقريباً حوالي نحو "
  "아마 약 또는 혹은 아니면 대략 대충 "
  "atau mungkin sekitar kira-kira misschien ongeveer wellicht może około lub albo mniej-więcej"
)
HEDGE_NEAR = _words(
  "about around nearly almost ca likely unlikely might could some somewhere something if unless whether depending "
  "depends close plus range ranging between possible unclear think believe suppose assume assuming order "
  "confidence confident "
  "ou rund gegen cerca casi quase quasi vers presque près unos unas alrededor gần gan ya या ou"
)
LIMIT = _words(
  "atleast atmost upto upwards onwards tops "
  "mindestens höchstens hoechstens almeno "
  "минимум максимум свыше "
  "적어도 최소 최대 이상 이하 미만 초과 "
  "minimal maksimal"
)
LIMIT_NEAR = _words(
  "least most max maximum min minimum over under above below beyond exceeding exceeds exceed within shy short "
  "mínimo máximo minimo massimo "
  "über ueber unter bis mehr weniger plus moins más mas menos mais più meno oltre "
  "больше меньше более менее до fazla az hơn hon trên dưới से أكثر أقل فوق تحت lebih kurang"
)
COMPARATIVE = _words("more less fewer greater larger smaller bigger higher lower than")  # refused before the number
CORRECTION = _words(
  # English: self-corrections, retractions and jokes
  "actually wait alternatively correction oops sorry otherwise hmm retract disregard nevermind "
  "jk jking kidding kiddin joking joke jest jesting lol lmao lmfao rofl haha hahaha hehe sike syke psych troll "
  "trolling trolled sarcasm sarcastic nvm typo typos whoops update updated edit edited erratum errata corrected "
  "revised revision retracted retracting recount recalculated "
  # German, French, Spanish, Portuguese, Italian
  "eigentlich korrektur warte hoppla quatsch scherz "
  "attends oups pardon désolé desole plaisanterie blague "
  "espera perdón perdon corrección correccion broma "
  "espere desculpe correção correcao brincadeira "
  "aspetta scusa correzione scherzo scherzavo "
  # Russian, Turkish, Vietnamese, Hindi, Arabic, Korean, Indonesian
  "подожди подождите стоп исправление поправка ошибся ошиблась шучу вернее точнее "
  "bekle dur pardon düzeltme duzeltme şaka saka "
  "khoan đính chính đùa "
  "रुको माफ़ माफ सुधार मज़ाक मजाक "
  "انتظر عفوا تصحيح آسف أمزح "
  "잠깐 정정 수정 죄송 농담 "
  "tunggu maaf koreksi bercanda"
)
# Two-word phrases: (first, second) -> kind; the kind applies to the second word.
PHRASES = {
  ("at", "least"): "comparison", ("at", "most"): "comparison", ("up", "to"): "comparison",
  ("scratch", "that"): "correction", ("scratch", "this"): "correction", ("ignore", "that"): "correction",
  ("ignore", "this"): "correction", ("ignore", "the"): "correction", ("not", "really"): "negation",
  ("tal", "vez"): "hedge", ("al", "menos"): "comparison", ("lo", "menos"): "comparison",
  ("au", "moins"): "comparison", ("au", "plus"): "comparison", ("peu", "près"): "hedge",
  ("pelo", "menos"): "comparison", ("no", "mínimo"): "comparison", ("no", "máximo"): "comparison",
  ("al", "massimo"): "comparison", ("ya", "da"): "hedge", ("en", "az"): "comparison", ("en", "fazla"): "comparison",
  ("có", "thể"): "hedge", ("có", "lẽ"): "hedge", ("ít", "nhất"): "comparison", ("nhiều", "nhất"): "comparison",
  ("tối", "đa"): "comparison", ("tối", "thiểu"): "comparison", ("không", "phải"): "negation",
  ("على", "الأقل"): "comparison", ("कम", "से"): "comparison", ("से", "कम"): "comparison",
  ("не", "менее"): "comparison", ("не", "более"): "comparison", ("paling", "sedikit"): "comparison",
  ("en", "realidad"): "correction", ("en", "fait"): "correction", ("na", "verdade"): "correction",
  ("in", "realtà"): "correction", ("на", "самом"): "correction", ("aslında", "da"): "correction",
}
PHRASES = {(unicodedata.normalize("NFKC", a), unicodedata.normalize("NFKC", b)): k for (a, b), k in PHRASES.items()}
ALTERNATIVE_EXTRA = _words(  # a different number after one of these is another answer
  "also could might may else possibility possibilities possible alternative option options "
  "auch aussi también tambem também anche тоже также ayrıca cũng भी أيضا 또한 juga ook też"
)
RESTART_EXTRA = _words(  # a clause or a following line that starts with one of these corrects the answer
  "no not nope never but however though although instead rather unless "
  "aber doch nein mais non pero sino mas porém porem ma però pero но однако нет ama fakat hayır nhưng "
  "लेकिन पर لكن بل 하지만 그러나 tapi namun maar ale"
)
JUDGMENT = _words(
  "wrong incorrect untrue mistake mistaken erroneous invalid bogus kidding joking "
  "falsch faux fausse incorrecto incorrecta errado errada sbagliato sbagliata неверно неправильно ошибка "
  "yanlış yanlis sai गलत ग़लत خطأ خاطئ 틀렸다 틀렸습니다 오답 salah"
)
DOUBT = _words(
  "sure certain confident convinced sicher sûr seguro segura certeza sicuro sicura уверен уверена emin"
)
NEGATIVE_WORDS = _words("minus negative")  # "minus 18" is -18
UNSUPPORTED_UNITS = _words("mille permille permil bps basis")  # would change the value; not interpreted
LINK = _words(
  # English
  "is are was were be being been equal equals to exactly quite really just simply necessarily going gonna the a "
  "an answer final result total value it its it's this that so thus therefore hence then we get gives would will "
  "should must definitely certainly surely clearly obviously as "
  # the same job in the other spaced languages: copulas, articles, "answer", "result", "so"
  "ist sind war wäre wird beträgt betraegt lautet ergibt die der das den antwort ergebnis endergebnis gesamt also "
  "est sont était etait sera serait c'est la le les réponse reponse résultat resultat donc égal egal égale "
  "es son era será sería el respuesta resultado entonces así igual "
  "é são será seria o os as resposta então portanto "
  "è sono sarà era il lo risposta risultato quindi uguale "
  "это равно равен равна составляет будет ответ результат итак значит поэтому "
  "olan eşittir esittir cevap yanıt sonuç sonuc bu yüzden "
  "là bằng được đáp án kết quả vậy nên "
  "है हैं था होगा उत्तर परिणाम इसलिए अतः "
  "هو هي يساوي تساوي الجواب الإجابة النتيجة إذن "
  "답은 답 결과는 따라서 "
  "adalah jawaban hasil jadi is het antwoord jest wynosi odpowiedź"
)

# Scripts written without spaces: a run of text is one token, read by substring.
_UNSPACED = {
  "negation": (
    "不 没 沒 非 无 無 否 未 错 錯 误 誤 "  # Chinese (and the kanji Japanese shares)
    "ない ません 違う 違い 間違 "  # Japanese
    "아니 않 못 없 틀리 틀렸 틀린 오답 잘못 "  # Korean
    "ไม่ ผิด"  # Thai
  ),
  "hedge": (
    "约 約 大概 可能 也许 也許 或许 或許 或 还是 還是 差不多 将近 將近 左右 上下 估计 估計 似乎 好像 "
    "およそ 大体 だいたい くらい ぐらい ほど 程度 前後 たぶん 多分 おそらく 恐らく かも または あるいは もしくは "
    "아마 대략 대충 정도 쯤 또는 혹은 아니면 거의 가량 내외 "
    "ประมาณ หรือ อาจ"
  ),
  "comparison": (
    "以上 以下 至少 至多 最多 最少 超过 超過 不到 低于 低於 高于 高於 大于 大於 小于 小於 多于 多於 少于 少於 开外 "
    "未満 少なくとも 最大 最小 最低 最高 "
    "이상 이하 미만 초과 최소 최대 적어도"
  ),
  "correction": (
    "更正 修正 订正 訂正 等等 等一下 其实 其實 实际上 實際上 抱歉 对不起 對不起 "
    "开玩笑 開玩笑 说错 說錯 改为 改為 应为 應為 "
    "待って 実は ごめん 冗談 "
    "정정 수정 잠깐 사실은 실은 죄송 농담"
  ),
}
UNSPACED_SIGNALS = tuple(
  (unicodedata.normalize("NFKC", s), kind) for kind, subs in _UNSPACED.items() for s in subs.split()
)
_UNSPACED_RANGES = (
  (0x0E00, 0x0E7F), (0x1100, 0x11FF), (0x3040, 0x30FF), (0x3130, 0x318F), (0x3400, 0x4DBF), (0x4E00, 0x9FFF),
  (0xAC00, 0xD7AF), (0xF900, 0xFAFF), (0x20000, 0x2FA1F),
)


def is_unspaced(word: str) -> bool:
  """The word holds letters of a script written without spaces between words (CJK, kana, Hangul, Thai)."""
  return any(lo <= ord(c) <= hi for c in word if ord(c) >= 0x0E00 for lo, hi in _UNSPACED_RANGES)


def unspaced_signal(run: str) -> tuple[str, str] | None:
  """(kind, substring) of the first signal in a run of unspaced text, or None. Linear in the run (a fixed list)."""
  for sub, kind in UNSPACED_SIGNALS:
    if sub in run:
      return kind, sub
  return None
