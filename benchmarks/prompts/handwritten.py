"""Prompts written by hand for jspec (CC0): math word problems, open writing, chat conversations.

Every item here is original text written for this project and dedicated to the public domain
(CC0 1.0). Items are split explicitly into SUITE_* and TRAIN_*; build.py asserts the two never
share a user message.
"""

# Grade-school word problems. Answers (for reference, never shown to the model) in comments.
SUITE_MATH = [
    # 34
    "A bakery bakes 144 muffins in the morning. It sells 5/8 of them before noon and 20 more in "
    "the afternoon. How many muffins are left at closing time?",
    # 450
    "Maya reads 18 pages every weekday and 30 pages on each day of the weekend. How many pages "
    "does she read in three full weeks?",
    # 215 minutes
    "A train leaves the station at 9:40 a.m. and arrives at 1:15 p.m. How many minutes does the "
    "trip take?",
    # 38
    "Tom has twice as many marbles as Ana. Together they have 57 marbles. How many marbles does "
    "Tom have? Show your work.",
    # $342
    "A rectangular garden is 12 m long and 7 m wide. Fencing costs $9 per meter. How much will it "
    "cost to put a fence all the way around the garden?",
    # $40.80
    "A shop sells notebooks for $2.40 each, or a pack of 6 for $12. Jamal needs exactly 20 "
    "notebooks. What is the least amount of money he can spend?",
    # 18.375 L
    "Lena's water bottle holds 750 mL. Every day she drinks three full bottles plus half a bottle. "
    "How many liters of water does she drink in one week?",
    # 4 vans, 4 empty seats
    "A class of 28 students is going on a field trip. Each van can carry 8 students. How many vans "
    "do they need, and how many seats will be empty?",
    # $48
    "Priya earns $12 an hour. She worked 6 hours on Saturday and 4 hours on Sunday, and she saves "
    "40% of what she earns. How much did she save this weekend?",
    # 10.5
    "A pancake recipe uses 3 eggs for every 2 cups of flour. How many eggs do you need if you use "
    "7 cups of flour?",
    # 13/20
    "A bag holds 5 red, 7 blue and 8 green balls. What fraction of the balls are not blue? Give "
    "the answer in simplest form.",
    # $40
    "A jacket costs $40. The store raises the price by 25%, then a week later puts it on sale for "
    "20% off the new price. What is the sale price? Is it cheaper than the original?",
    # 16
    "Carlos is 4 years older than his sister. In 6 years, the sum of their ages will be 40. How "
    "old is Carlos now?",
    # 30 minutes
    "A water tank is being filled at 15 liters per minute, but a leak drains 6 liters per minute. "
    "The tank starts empty. How long until it holds 270 liters?",
    # 54 full boxes
    "A farmer has 9 rows of tomato plants with 14 plants in each row. Each plant gives about 6 "
    "tomatoes. He keeps 100 tomatoes for his family and packs the rest into boxes of 12. How many "
    "full boxes can he fill?",
    # 17.5 km
    "Sam runs 2.5 km on Monday. Each day after that he runs 0.5 km more than the day before. How "
    "many kilometers has he run in total by the end of Friday?",
]

TRAIN_MATH = [
    "A cinema has 18 rows with 24 seats in each row. 347 tickets were sold for tonight's show. How "
    "many seats will be empty?",
    "Nadia buys 3 kg of apples at $2.60 per kg and 2 kg of pears at $3.15 per kg. She pays with a "
    "$20 bill. How much change does she get?",
    "A bus drives a 42 km route 6 times a day. How many kilometers does it drive in a 5-day work "
    "week?",
    "Leo saved $7 every week for 15 weeks. Then he spent one third of his savings on a video game. "
    "How much money does he have left?",
    "A pizza is cut into 12 equal slices. Four friends each eat 2 slices and their dad eats 3. What "
    "fraction of the pizza is left?",
    "At 6 a.m. the temperature was -4 degrees Celsius. It rose by 3 degrees every two hours. What "
    "was the temperature at 2 p.m.?",
    "A school orders 35 boxes of pencils with 24 pencils in each box and shares them equally among "
    "28 classes. How many pencils does each class get?",
    "Kim's phone plan costs $18 a month plus 5 cents for every text message over 200. In March she "
    "sent 340 texts. How much was her bill?",
    "Three friends share a restaurant bill of $84 and add a 15% tip. They split the total equally. "
    "How much does each person pay?",
    "A bicycle wheel has a circumference of 2.1 meters. How many full turns does the wheel make "
    "when the bike travels 1 kilometer?",
    "The perimeter of a square is 36 cm. What is its area?",
    "Jo has 20 stickers. Mei has 8 fewer stickers than Jo, and Ravi has three times as many as "
    "Mei. How many stickers do the three of them have altogether?",
    "A cookie recipe makes 30 cookies and needs 250 g of butter. How much butter do you need to "
    "make 72 cookies?",
    "A car uses 6.5 liters of fuel per 100 km, and fuel costs $1.80 per liter. How much does the "
    "fuel cost for a 340 km trip?",
    "A library had 1,240 books. It gave away 15% of them to a school and then bought 90 new books. "
    "How many books does the library have now?",
    "A movie starts at 7:45 p.m. and is 2 hours and 38 minutes long. At what time does it end?",
    "Erin practices the piano for 25 minutes every weekday and for 50 minutes on Saturday. She "
    "rests on Sunday. How many hours and minutes does she practice in 4 weeks?",
    "An egg carton holds 6 rows of 8 eggs. A farm collected 1,000 eggs today. How many cartons can "
    "be completely filled, and how many eggs are left over?",
    "Two numbers add up to 50. One of them is 14 more than the other. What are the two numbers?",
    "Three fifths of Sofia's garden is planted with vegetables and the rest with flowers. The "
    "flower part covers 24 square meters. What is the area of the whole garden?",
    "A jug holds 4 liters of water. Each glass holds 250 mL. After 9 glasses have been poured, how "
    "much water is left in the jug?",
    "Jack scored 78, 85 and 91 on his first three tests. What does he need on the fourth test to "
    "have an average of 86?",
    "On a map, 1 cm stands for 5 km. Two towns are 7.4 cm apart on the map. How far apart are they "
    "in real life?",
    "A shop has 3 shelves with 45 cans of soup on each. On Monday it sells 38 cans and then puts 20 "
    "new cans on the shelves. How many cans are there now?",
    "A hiker walks at 4 km per hour for 2.5 hours, takes a break, and then walks at 3 km per hour "
    "for another 1.5 hours. How far did she walk in total?",
    "A garden hose fills a 60-liter bucket in 4 minutes. At the same rate, how long will it take to "
    "fill a pond that holds 450 liters?",
    "At the zoo, adult tickets cost $12 and child tickets cost $7. A group of 9 people paid $83 in "
    "total. How many children were in the group?",
    "A rope 15 meters long is cut into pieces that are each 1.2 meters long. How many full pieces "
    "are there, and how long is the piece that is left over?",
    "A classroom has 6 tables with 4 chairs each and 3 tables with 6 chairs each. If 31 students "
    "sit down, how many chairs are still empty?",
    "A factory makes 240 toys every hour, and 1 out of every 40 toys is faulty. How many good toys "
    "does it make in an 8-hour shift?",
]

SUITE_WRITING = [
    "Write a short poem about a lighthouse keeper on the last night before the lighthouse is "
    "automated.",
    "Can you write a friendly email to my neighbour asking if they could water my plants while I'm "
    "away for a week in August?",
    "Give me five ideas for a ten-year-old's birthday party on a small budget.",
    "Write a 150-word product description for a reusable bamboo lunch box.",
    "I'm nervous about my first day at a new job tomorrow. Any tips?",
    "Write the opening paragraph of a mystery story set in a small mountain village during a "
    "snowstorm.",
    "Explain to a seven-year-old why the sky is blue, in three or four sentences.",
    "Draft a polite message declining a wedding invitation because I'll be on a work trip that "
    "week.",
    "What are some good habits for getting better sleep?",
    "Write a haiku about the first rain after a long drought.",
    "Help me write a toast for my sister's graduation party. It should take less than a minute to "
    "say out loud.",
    "Compare living in a big city with living in the countryside. Give two advantages of each.",
    "Write a short motivational note for a friend who is training for their first marathon.",
    "Suggest a simple weekly meal plan for a vegetarian student who only has time to cook on "
    "weekends.",
    "Write a limerick about a cat who is afraid of cucumbers.",
    "Describe an autumn morning in a city park using all five senses.",
]

TRAIN_WRITING = [
    "Write a thank-you note to a teacher who helped me with maths this year.",
    "Give me three tips for keeping houseplants alive in a dark apartment.",
    "Write a short story, under 200 words, about a robot who learns to bake bread.",
    "What should I pack for a three-day camping trip in the mountains?",
    "Write an opening sentence for a cover letter for a barista job.",
    "Explain what a budget is and why it helps, for a teenager who just got their first paycheck.",
    "Write a poem about the sounds of a city at 3 a.m.",
    "My best friend is moving abroad. Help me write a goodbye card message.",
    "List some fun indoor activities for a rainy Sunday with two small kids.",
    "Write a two-sentence horror story set in a library.",
    "How can I politely ask my roommate to clean up the kitchen more often?",
    "Describe the taste of a ripe mango to someone who has never eaten one.",
    "Write a short speech to open a new community garden.",
    "What are the pros and cons of working from home?",
    "Write a bedtime story about a small owl who is afraid of the dark.",
    "Suggest five names for a bakery that specializes in sourdough bread.",
    "Write a review of an imaginary seaside cafe in three short paragraphs.",
    "Give me a simple 20-minute morning stretching routine.",
    "Write an apology message to a customer whose order arrived a week late.",
    "Explain the water cycle in simple terms.",
    "Write a fourteen-line poem about a train station at dawn.",
    "Write a short dialogue between a grandmother and her grandson about learning to fish.",
    "I want to start keeping a journal. Can you give me prompts for the first week?",
    "Write a short LinkedIn post announcing that I finished an online course in data analysis.",
    "Describe a futuristic city that runs entirely on solar power.",
    "What are some easy ways to reduce plastic waste at home?",
    "Write a funny out-of-office email reply.",
    "Plan a relaxing Saturday at home for someone recovering from a very busy week.",
    "Write a fable about a tortoise and a crow that teaches patience.",
    "Explain in one paragraph why reading books is good for the brain.",
]

# Conversations: lists of (role, text). "{code:MODULE:QUALNAME}" is replaced by build.py with the
# real stdlib source of that function, and the module is then recorded as the source.
SUITE_MULTI_TURN = [
    [("user", "I want to bake bread for the first time. What kind should I start with?"),
     ("assistant", "A simple no-knead white loaf is a great first bread. It only needs flour, "
      "water, salt and yeast, and almost no technique."),
     ("user", "How long does the dough need to rise?"),
     ("assistant", "For a no-knead loaf, let it rise 12 to 18 hours at room temperature, then "
      "shape it and let it rest for another 1 to 2 hours before baking."),
     ("user", "I only have 4 hours today. Can I speed it up somehow?")],
    [("user", "What's 15% of 240?"),
     ("assistant", "15% of 240 is 36."),
     ("user", "And if I add that to 240?"),
     ("assistant", "240 + 36 = 276."),
     ("user", "Now take 10% off 276. What do I end up with, and is it more or less than 240?")],
    [("system", "You are a friendly travel assistant. Keep answers short."),
     ("user", "I'm visiting Lisbon for two days in May."),
     ("assistant", "Lovely choice! May is warm but not too hot, so it's a great time to walk "
      "around the old neighbourhoods."),
     ("user", "What should I see on the first day?"),
     ("assistant", "Start in Alfama: walk up to the castle for the view over the river, then "
      "wander down through the narrow streets to the waterfront."),
     ("user", "Sounds good. For the second day I'd like to get out of the city center. Any "
      "ideas that don't need a car?")],
    [("user", "What does this function do?\n\n```python\n{code:calendar.py:isleap}\n```"),
     ("assistant", "It returns True if `year` is a leap year: divisible by 4, except century years, "
      "which must also be divisible by 400. So 2000 is a leap year but 1900 is not."),
     ("user", "So is 2100 a leap year?"),
     ("assistant", "No. 2100 is divisible by 100 but not by 400, so `isleap(2100)` returns "
      "False."),
     ("user", "Can you write a function that takes a list of years and returns only the leap "
      "years, using this one?")],
    [("user", "Can you explain this?\n\n```python\n{code:fnmatch.py:filter}\n```"),
     ("assistant", "`filter` returns the names from `names` that match the shell-style pattern "
      "`pat`. On POSIX it skips case normalisation because `normcase` does nothing there; on "
      "other systems it normalises each name before matching."),
     ("user", "What kind of patterns can I use?"),
     ("assistant", "Shell-style wildcards: `*` matches anything, `?` matches a single character, "
      "and `[seq]` or `[!seq]` match one character that is or isn't in the set."),
     ("user", "How would I make it always case-insensitive, even on Linux?")],
    [("user", "Write a two-line slogan for a bike repair shop."),
     ("assistant", "Fix it fast, ride it far.\nWe keep your wheels turning, near and far."),
     ("user", "Nice. Can you give me another option?"),
     ("assistant", "Flat tire? Squeaky chain?\nBring it in, we'll make it sing again."),
     ("user", "Make the second one shorter and a bit funnier.")],
    [("user", "Can you explain what photosynthesis is in one sentence?"),
     ("assistant", "Photosynthesis is how plants use sunlight to turn water and carbon dioxide "
      "into sugar, releasing oxygen as a by-product."),
     ("user", "What are the inputs and outputs exactly?"),
     ("assistant", "Inputs: sunlight, water and carbon dioxide. Outputs: glucose (sugar) and "
      "oxygen."),
     ("user", "Great. Give me a quick three-question quiz on it, with answers at the end.")],
    [("user", "Can you make this sentence more formal: \"hey, can we move the meeting to "
      "thursday?\""),
     ("assistant", "Would it be possible to reschedule our meeting to Thursday?"),
     ("user", "Now make it sound a little warmer, but still professional."),
     ("assistant", "Hi Anna, would it be possible to move our meeting to Thursday? I'd really "
      "appreciate it."),
     ("user", "Great. Add one sentence explaining that I have a dentist appointment on "
      "Wednesday.")],
    [("user", "Is there an easy way to get the 3 largest numbers from a list in Python?"),
     ("assistant", "Yes. Use `heapq.nlargest(3, numbers)`, or simply `sorted(numbers, "
      "reverse=True)[:3]` for small lists."),
     ("user", "What if I have a list of words and want the 3 longest ones?"),
     ("assistant", "Pass a key function: `heapq.nlargest(3, words, key=len)`."),
     ("user", "And if two words have the same length, which one comes first in the result?")],
    [("user", "I get `TypeError: can only concatenate str (not \"int\") to str`. What does that "
      "mean?"),
     ("assistant", "It means you tried to join a string and an integer with `+`. Python won't "
      "convert the number to text automatically."),
     ("user", "My line is `print('Total: ' + total)`. How do I fix it?"),
     ("assistant", "Convert the number first: `print('Total: ' + str(total))`, or use an f-string: "
      "`print(f'Total: {total}')`."),
     ("user", "Which of those two is better, and why?")],
    [("user", "What's the difference between str.split() and shlex.split()?"),
     ("assistant", "`str.split()` just breaks on whitespace. `shlex.split()` follows shell rules, "
      "so a quoted part like \"my file.txt\" stays together as one item."),
     ("user", "What does `posix=False` change here?\n\n```python\n{code:shlex.py:split}\n```"),
     ("assistant", "With `posix=False` the lexer runs in compatibility mode: quotes are kept in "
      "the resulting tokens and backslash escapes are not processed the POSIX way."),
     ("user", "Show me an input where `split(s)` and `split(s, posix=False)` give different "
      "results, and what each one returns.")],
    [("user", "I have to give a 5-minute talk at work about our team's new project. How should I "
      "structure it?"),
     ("assistant", "Try: the problem (1 min), what you built (2 min), a short demo or example "
      "(1 min), and next steps plus questions (1 min)."),
     ("user", "The project is a tool that automates our weekly sales reports. Can you draft the "
      "first minute for me?"),
     ("assistant", "\"Every Monday, three of us spent half a day copying numbers into "
      "spreadsheets. That's about 80 hours a month of work nobody enjoyed. So we built a tool "
      "that does it in five minutes.\""),
     ("user", "That's a good start. Make it less formal and add a light joke.")],
    [("user", "I want to start running. Should I buy special shoes first?"),
     ("assistant", "It helps. A running shop can look at how you run and suggest a comfortable "
      "pair; you don't need the most expensive model."),
     ("user", "OK. How often should I run in the first month?"),
     ("assistant", "Three times a week is plenty. Start with 20 minutes of alternating running "
      "and walking, and keep at least one rest day between runs."),
     ("user", "I get bored really easily. Any ideas to keep it fun?")],
    [("user", "A rectangle has a perimeter of 30 cm and its length is twice its width. What are "
      "its sides?"),
     ("assistant", "The width is 5 cm and the length is 10 cm."),
     ("user", "What is its area?"),
     ("assistant", "5 cm x 10 cm = 50 square centimeters."),
     ("user", "If I double both sides, what happens to the area, and why?")],
    [("user", "Write a Python function that checks whether a string is a palindrome."),
     ("assistant", "```python\ndef is_palindrome(s):\n    return s == s[::-1]\n```"),
     ("user", "Make it ignore spaces, punctuation and capital letters."),
     ("assistant", "```python\ndef is_palindrome(s):\n    cleaned = ''.join(c.lower() for c in s "
      "if c.isalnum())\n    return cleaned == cleaned[::-1]\n```"),
     ("user", "Now write a few pytest test cases for it, including some edge cases.")],
    [("user", "Can you explain what this does?\n\n```python\n{code:glob.py:escape}\n```"),
     ("assistant", "It escapes the glob wildcards `*`, `?` and `[` by wrapping each one in square "
      "brackets, so they match literally. The drive part of a Windows path is left untouched."),
     ("user", "Why wrap them in square brackets instead of using a backslash like in regular "
      "expressions?"),
     ("assistant", "Glob patterns have no backslash escape, and on Windows the backslash is the "
      "path separator. A bracket expression such as `[*]` matches exactly one literal `*` "
      "everywhere."),
     ("user", "When would I actually need this function? Give me a realistic example.")],
]

TRAIN_MULTI_TURN = [
    [("user", "Recommend a board game for four adults who don't like long games."),
     ("assistant", "Try Codenames: a round takes about 15 minutes and it's easy to teach."),
     ("user", "We've played that one a lot. Something with a bit more strategy?")],
    [("user", "How do I convert Celsius to Fahrenheit?"),
     ("assistant", "Multiply by 9/5 and add 32: F = C x 9/5 + 32."),
     ("user", "So what is 37 degrees Celsius in Fahrenheit?")],
    [("user", "I'm writing a birthday card for my grandfather, who is turning 90."),
     ("assistant", "How lovely! Would you like it to be heartfelt, funny, or a bit of both?"),
     ("user", "A bit of both. He loves gardening and terrible puns.")],
    [("user", "What's the difference between a list and a tuple in Python?"),
     ("assistant", "Lists are mutable, so you can add, remove and change items. Tuples are "
      "immutable: once created, they can't be changed."),
     ("user", "When would I choose a tuple, then?")],
    [("user", "Give me a word that means 'very happy'."),
     ("assistant", "Elated."),
     ("user", "Another one, but less formal?")],
    [("user", "Write a SQL query that counts orders per customer from a table orders(id, "
      "customer_id)."),
     ("assistant", "```sql\nSELECT customer_id, COUNT(*) AS n_orders\nFROM orders\nGROUP BY "
      "customer_id;\n```"),
     ("user", "Now only show customers with more than 5 orders, sorted from most to fewest.")],
    [("user", "I have eggs, spinach and feta. What can I make for lunch?"),
     ("assistant", "A spinach and feta omelette would be quick: wilt the spinach, pour in the "
      "beaten eggs, and crumble the feta on top."),
     ("user", "I don't have a frying pan, only an oven.")],
    [("user", "Summarize the plot of Romeo and Juliet in two sentences."),
     ("assistant", "Two teenagers from feuding families in Verona fall in love and marry in "
      "secret. A chain of misunderstandings leads both of them to take their own lives, which "
      "finally reconciles their families."),
     ("user", "Now tell it as a haiku.")],
    [("user", "I need to learn some basic Spanish for a trip in six weeks."),
     ("assistant", "Focus on greetings, numbers, directions and ordering food. Fifteen minutes a "
      "day with flashcards works well."),
     ("user", "Can you give me ten useful phrases for ordering food?")],
    [("user", "The leaves on my tomato plant are turning yellow."),
     ("assistant", "That's often overwatering or a lack of nitrogen. Are the lower leaves turning "
      "yellow first?"),
     ("user", "Yes, the bottom ones. And the soil is always damp.")],
]
